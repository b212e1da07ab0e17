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

// CountTokens asks the server's tokenizer route (path, e.g. /tokenize)
// how many tokens the prompt of a chat request body holds. With chat the
// route takes the body's "messages" and applies the chat template (vLLM:
// the exact prompt count, "count" in its answer); without, it is sent the
// messages' text as {"content": text} (llama-server) and the length of
// its "tokens" is a lower bound of the prompt's: the template only adds.
func (c *Client) CountTokens(ctx context.Context, path string, chat bool, model string, body json.RawMessage) (int, error) {
	const what = "tokenize"
	if c.urlErr != nil {
		return 0, &Error{Class: ServerDown, Msg: what, Err: c.urlErr}
	}
	var in struct {
		Messages json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return 0, &Error{Class: BadRequest, Msg: what + ": request body is not a JSON object", Err: err}
	}
	var req any = map[string]any{"content": messagesText(in.Messages)}
	if chat {
		req = map[string]any{"model": model, "messages": in.Messages, "add_generation_prompt": true}
	}
	b, err := json.Marshal(req)
	if err != nil {
		return 0, &Error{Class: BadRequest, Msg: what + ": encode", Err: err}
	}
	k := c.start(ctx)
	defer k.done()
	url := strings.TrimSuffix(c.chatURL, "/v1/chat/completions") + path
	hreq, err := http.NewRequestWithContext(k.ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return 0, &Error{Class: ServerDown, Msg: what, Err: err}
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := c.do(k, hreq, what)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var out struct {
		Count  *int              `json:"count"`
		Tokens []json.RawMessage `json:"tokens"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 256<<20)).Decode(&out); err != nil {
		return 0, &Error{Class: Malformed, Msg: fmt.Sprintf("%s %s", what, url), Err: err}
	}
	if out.Count != nil {
		return *out.Count, nil
	}
	return len(out.Tokens), nil
}

// messagesText is the text of chat messages, each content (a string, or
// the text parts of a list) on its own line.
func messagesText(raw json.RawMessage) string {
	var msgs []struct {
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(raw, &msgs) != nil {
		return ""
	}
	var b strings.Builder
	for _, m := range msgs {
		var s string
		var parts []struct {
			Text string `json:"text"`
		}
		switch {
		case json.Unmarshal(m.Content, &s) == nil:
		case json.Unmarshal(m.Content, &parts) == nil:
			for _, p := range parts {
				s += p.Text
			}
		}
		b.WriteString(s)
		b.WriteByte('\n')
	}
	return b.String()
}
