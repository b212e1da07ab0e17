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
// and must answer 200 with token_ids. A release without the route answers
// 404 (false, nil); a server that does not answer at all is an error.
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
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return false, nil
	}
	var out struct {
		TokenIDs []int64 `json:"token_ids"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&out); err != nil || len(out.TokenIDs) == 0 {
		return false, nil
	}
	return true, nil
}
