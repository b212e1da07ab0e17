package probe

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/regen-dev/regen/internal/engine"
)

// Render reports whether the server at baseURL offers its dialect's chat
// render route (engine.Dialect.RenderPath): it renders a one-message chat
// and must answer 200 with token_ids. Only the answers of a server without
// the route are a verdict (false, nil): 404 (a release before it: FastAPI's
// answer to an unknown path), 405, and 501 (vLLM's route on a server with
// no renderer: vllm/entrypoints/serve/render/api_router.py declares it and
// raises NotImplementedError; docs/engines.md §15.1). Any other status (503 while the model loads, 401
// for a refused key, 5xx) and a server that does not answer are an error:
// the route is unknown yet, to be asked again.
func Render(ctx context.Context, client *http.Client, baseURL string, d engine.Dialect, apiKey string) (bool, error) {
	if d.RenderPath == "" {
		return false, nil
	}
	if client == nil {
		client = http.DefaultClient
	}
	url := strings.TrimRight(baseURL, "/") + d.RenderPath
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		return false, fmt.Errorf("render %s: %w", url, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, fmt.Errorf("render %s: %w", url, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusNotImplemented:
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return false, nil
	default:
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return false, fmt.Errorf("render %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	var out struct {
		TokenIDs []int64 `json:"token_ids"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&out); err != nil || len(out.TokenIDs) == 0 {
		return false, nil
	}
	return true, nil
}
