package probe

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/regen-dev/regen/internal/sim"
)

// TestRender: a current vLLM offers the chat render route, a previous one
// answers 404, and SGLang's dialect has none to ask for.
func TestRender(t *testing.T) {
	for _, tt := range []struct {
		engine, shape, dialect string
		want                   bool
	}{
		{"vllm", "current", "vllm", true},
		{"vllm", "previous", "vllm", false},
		{"sglang", "current", "sglang", false},
	} {
		c := sim.DefaultConfig()
		c.Engine, c.APIShape = tt.engine, tt.shape
		srv := serveSim(t, c)
		got, err := Render(context.Background(), srv.Client(), srv.URL, dialect(t, tt.dialect), "")
		if err != nil || got != tt.want {
			t.Errorf("%s %s: Render = %v, %v; want %v", tt.engine, tt.shape, got, err, tt.want)
		}
	}
}

// TestRenderStatuses: only the answers of a server without the route (404
// as FastAPI gives for an unknown path, 405, 501 as vLLM's route gives
// without a renderer) say "no route"; a server that is loading, refuses the
// key or fails is an error, to be asked again, not a verdict for the run.
func TestRenderStatuses(t *testing.T) {
	for _, tt := range []struct {
		status  int
		body    string
		want    bool
		wantErr string
	}{
		{http.StatusOK, `{"token_ids":[1,2]}`, true, ""},
		{http.StatusNotFound, `{"detail":"Not Found"}`, false, ""},
		{http.StatusMethodNotAllowed, `{"detail":"Method Not Allowed"}`, false, ""},
		{http.StatusNotImplemented, `{"error":{"message":"The model does not support Chat Completions Render API"}}`, false, ""},
		{http.StatusServiceUnavailable, `loading`, false, "503 Service Unavailable: loading"},
		{http.StatusUnauthorized, `{"error":"Unauthorized"}`, false, `401 Unauthorized: {"error":"Unauthorized"}`},
		{http.StatusInternalServerError, `boom`, false, "500 Internal Server Error: boom"},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(tt.status)
			io.WriteString(w, tt.body)
		}))
		got, err := Render(context.Background(), srv.Client(), srv.URL, dialect(t, "vllm"), "")
		srv.Close()
		if got != tt.want || (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("status %d: Render = %v, %v; want %v, error containing %q", tt.status, got, err, tt.want, tt.wantErr)
		}
	}
}
