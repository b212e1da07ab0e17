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

// Detect asks the server at baseURL what engine it is, from what it says
// of itself (docs/engines.md §13.4): llama-server's `Server: llama.cpp`
// header or `owned_by: llamacpp` in /v1/models, vLLM's and SGLang's
// owned_by there, else vLLM's /version or SGLang's /server_info. It
// returns the engine's name and the evidence; an error when the server
// answers none of them (the caller keeps its default).
func Detect(ctx context.Context, client *http.Client, baseURL string) (name, evidence string, err error) {
	if client == nil {
		client = http.DefaultClient
	}
	baseURL = strings.TrimRight(baseURL, "/")
	name, evidence, err = fromModels(ctx, client, baseURL+engine.ModelsPath)
	if name != "" {
		return name, evidence, nil
	}
	for _, c := range []struct{ path, engine string }{
		{"/version", engine.VLLM}, {"/server_info", engine.SGLang}, {"/get_server_info", engine.SGLang},
	} {
		if status, herr := Health(ctx, client, baseURL+c.path); herr == nil && status == http.StatusOK {
			return c.engine, fmt.Sprintf("GET %s answered 200", c.path), nil
		}
	}
	if err == nil {
		err = fmt.Errorf("detect %s: the server names no engine", baseURL)
	}
	return "", "", err
}

// fromModels reads the Server header and the owned_by of /v1/models.
func fromModels(ctx context.Context, client *http.Client, url string) (name, evidence string, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", "", fmt.Errorf("detect %s: %w", url, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", "", fmt.Errorf("detect %s: %w", url, err)
	}
	defer resp.Body.Close()
	if srv := resp.Header.Get("Server"); strings.Contains(strings.ToLower(srv), "llama.cpp") {
		return engine.LlamaCpp, "Server: " + srv, nil
	}
	var list struct {
		Data []struct {
			OwnedBy string `json:"owned_by"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list); err != nil {
		return "", "", fmt.Errorf("detect %s: %w", url, err)
	}
	for _, m := range list.Data {
		switch strings.ToLower(m.OwnedBy) {
		case "llamacpp":
			return engine.LlamaCpp, "owned_by: " + m.OwnedBy, nil
		case "vllm":
			return engine.VLLM, "owned_by: " + m.OwnedBy, nil
		case "sglang":
			return engine.SGLang, "owned_by: " + m.OwnedBy, nil
		}
	}
	return "", "", nil
}
