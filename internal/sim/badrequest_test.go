package sim

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestBadRequestFault: a 4xx error burst answers with the configured
// message in the engine's error shape, as a server refusing a parameter does.
func TestBadRequestFault(t *testing.T) {
	c := testConfig()
	const msg = "1 validation error for ChatCompletionRequest: top_k: Input should be a valid integer"
	if err := c.Apply(map[string]any{"error_count": 3, "error_status": 400, "error_message": msg}); err != nil {
		t.Fatal(err)
	}
	_, url, _ := startServer(t, c)
	var statuses []int
	for range 4 {
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("x", 5, "")))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		statuses = append(statuses, resp.StatusCode)
		if resp.StatusCode == 400 {
			var e struct {
				Object, Message, Type string
				Code                  int
			}
			if err := json.Unmarshal(b, &e); err != nil || e.Message != msg || e.Code != 400 || e.Type != "BadRequestError" {
				t.Errorf("400 body = %s (%v), want the error object with the message", b, err)
			}
		}
	}
	if diff := cmp.Diff([]int{400, 400, 400, 200}, statuses); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	if _, err := ParseFault(map[string]any{"kind": "error", "status": 302}); err == nil {
		t.Error("a 3xx error fault was accepted")
	}
	f, err := ParseFault(map[string]any{"kind": "error", "status": 422, "message": "bad"})
	if err != nil || f.Status != 422 || f.Message != "bad" {
		t.Errorf("ParseFault(422, bad) = %+v, %v", f, err)
	}
}

func TestRecordRequest(t *testing.T) {
	c := testConfig()
	var mu sync.Mutex
	var got []string
	c.RecordRequest = func(body []byte) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, string(body))
	}
	_, url, _ := startServer(t, c)
	bodies := []string{chatBody("first", 3, ""), chatBody("second", 3, "")}
	for _, b := range bodies {
		if r := streamChat(http.DefaultClient, url, b); !r.done {
			t.Fatalf("stream: %v", r.err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff(bodies, got); diff != "" {
		t.Errorf("recorded bodies (-want +got):\n%s", diff)
	}
}
