package capture

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestVLLMAnswers: what a capture server answers decides whose failure it
// is: a request it refuses (400/413/422) is the key's own; an outage, a
// route or key it does not know, or an answer naming no file or no
// prompt ids is the server's, and spends no attempt.
func TestVLLMAnswers(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   string
		own    string // the key's own kind; "" = the server's failure
	}{
		{"too long", 400, `{"error":{"message":"This model's maximum context length is 8192 tokens"}}`, KindRequest},
		{"unprocessable", 422, `{}`, KindRequest},
		{"engine dead", 500, `{"error":{"message":"EngineDeadError"}}`, ""},
		{"unavailable", 503, ``, ""},
		{"unknown model", 404, `{"error":{"message":"The model m does not exist."}}`, ""},
		{"not json", 200, `<html>`, ""},
		{"no connector", 200, `{"choices":[{"text":"x","prompt_token_ids":[1,2]}]}`, ""},
		{"no prompt ids", 200, `{"choices":[{"text":"x"}],"kv_transfer_params":{"hidden_states_path":"/x.safetensors"}}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/v1/completions" {
					t.Errorf("path %s", r.URL.Path)
				}
				w.WriteHeader(tt.status)
				w.Write([]byte(tt.body))
			}))
			defer srv.Close()
			v := &VLLM{URL: srv.URL, Model: "m"}
			_, err := v.Capture(context.Background(), Request{Key: "k", InputIDs: []int64{1, 2}})
			fe, own := ownError(err)
			var se *ServerError
			switch {
			case tt.own != "" && (!own || fe.Kind != tt.own):
				t.Errorf("err = %v, want the key's own %s", err, tt.own)
			case tt.own == "" && !errors.As(err, &se):
				t.Errorf("err = %v (%T), want a *ServerError", err, err)
			}
		})
	}
}

// TestVLLMWaitsForTheWriter: Capture returns once the connector releases
// its lock on the file, and fails as slow when it holds it past FileWait.
func TestVLLMWaitsForTheWriter(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cmpl-1-0.safetensors")
	lock, err := os.Create(path + ".lock")
	must(t, err)
	must(t, syscall.Flock(int(lock.Fd()), syscall.LOCK_EX))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"choices":[{"prompt_token_ids":[1,2]}],"kv_transfer_params":{"hidden_states_path":"` + path + `"}}`))
	}))
	defer srv.Close()
	v := &VLLM{URL: srv.URL, FileWait: 200 * time.Millisecond}
	_, err = v.Capture(context.Background(), Request{InputIDs: []int64{1, 2}})
	if fe, ok := ownError(err); !ok || fe.Kind != KindSlow {
		t.Fatalf("with the lock held: %v, want %s", err, KindSlow)
	}
	var released atomic.Bool
	release := time.AfterFunc(100*time.Millisecond, func() { released.Store(true); lock.Close() })
	defer release.Stop()
	v.FileWait = time.Minute
	res, err := v.Capture(context.Background(), Request{InputIDs: []int64{1, 2}})
	if err != nil || res.Path != path || !released.Load() {
		t.Fatalf("Capture = %+v, %v, lock released: %v; want the path once the lock is released", res, err, released.Load())
	}
}
