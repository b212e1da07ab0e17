package llm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// RenderChat asks the server's chat render route (path: vLLM's
// /v1/chat/completions/render, docs/engines.md §15.1) for the prompt ids of
// req as Chat would send it (same messages, tools, template kwargs and
// settings, unstreamed): the server's chat template and tokenizer applied,
// nothing generated. It answers the token_ids of vLLM's GenerateRequest.
func (c *Client) RenderChat(ctx context.Context, path string, req Request) ([]int32, error) {
	const what = "render"
	if c.urlErr != nil {
		return nil, &Error{Class: ServerDown, Msg: what, Err: c.urlErr}
	}
	body, err := buildBody(req, nil)
	if err != nil {
		return nil, err
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		return nil, &Error{Class: BadRequest, Msg: what + ": encode", Err: err}
	}
	delete(obj, "stream")
	delete(obj, "stream_options")
	if body, err = json.Marshal(obj); err != nil {
		return nil, &Error{Class: BadRequest, Msg: what + ": encode", Err: err}
	}
	k := c.start(ctx)
	defer k.done()
	url := strings.TrimSuffix(c.chatURL, "/v1/chat/completions") + path
	hreq, err := http.NewRequestWithContext(k.ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, &Error{Class: ServerDown, Msg: what, Err: err}
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := c.do(k, hreq, what)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out struct {
		TokenIDs []int32 `json:"token_ids"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 256<<20)).Decode(&out); err != nil {
		return nil, &Error{Class: Malformed, Msg: fmt.Sprintf("%s %s", what, url), Err: err}
	}
	if out.TokenIDs == nil {
		return nil, &Error{Class: Malformed, Msg: fmt.Sprintf("%s %s: no token_ids in the answer", what, url)}
	}
	return out.TokenIDs, nil
}
