package dispatch

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// TestCorruptStoredBodyIsDeadLettered: the dispatcher splits a stored body
// without checking it again (conversation.DecodeStored), so a body
// corrupted in the store after ingest still ends as a dead letter naming
// the sample with a reason that says what is wrong, and the rest of the
// job runs: a body cut short is never sent (its decode error is the reason);
// a conversation whose string holds a bad escape is sent as stored and
// the server's refusal (400) is the reason; a single turn with one is
// refused by the client, which walks a body sent as stored.
func TestCorruptStoredBodyIsDeadLettered(t *testing.T) {
	var mu sync.Mutex
	var sent [][]byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		sent = append(sent, body)
		mu.Unlock()
		if !json.Valid(body) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"object":"error","message":"JSON decode error: invalid escape","type":"BadRequestError","code":400}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(standInStream)
	}))
	defer srv.Close()

	conv := func(first string) []byte {
		raw := func(s string) json.RawMessage { b, _ := json.Marshal(s); return b }
		return conversation.Encode(&conversation.Body{
			Messages: []conversation.Message{{Role: "system", Content: raw("be brief")}, {Role: "user", Content: raw(first)}},
			Turns:    []conversation.Turn{{Input: []conversation.Message{{Role: "user", Content: raw("and then?")}}}},
		})
	}
	good := conv("hello")
	bodies := map[string][]byte{
		"good-1": good, "good-2": conv("hi"),
		"cut":         good[:len(good)-7],
		"escape-conv": bytes.Replace(conv("a marker word"), []byte("marker"), []byte(`\qmarker`), 1),
		"escape-1t":   []byte(`{"messages":[{"role":"user","content":"one \q turn"}]}`),
	}
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "job.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var ns []store.NewSample
	for id, b := range bodies {
		ns = append(ns, store.NewSample{ID: id, Partition: "p", Lane: "short", Body: b, PromptTokens: 10})
	}
	if _, err := st.Ingest(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	client := llm.New(llm.Config{BaseURL: srv.URL})
	defer client.Close()
	d := mustNew(t, baseConfig(st, []Endpoint{{URL: srv.URL, Client: client}}))
	if err := d.Run(t.Context()); err != nil {
		t.Fatal(err)
	}

	want := map[string]struct {
		state  store.State
		reason string
	}{
		"good-1":      {store.Done, ""},
		"good-2":      {store.Done, ""},
		"cut":         {store.Dead, "build request: decode sample body"},
		"escape-conv": {store.Dead, "JSON decode error: invalid escape"},
		"escape-1t":   {store.Dead, "request body is not a JSON object"},
	}
	for id, w := range want {
		row, ok, err := st.Sample(t.Context(), id)
		if err != nil || !ok {
			t.Fatalf("sample %s: %v, found %v", id, err, ok)
		}
		if row.State != w.state || !strings.Contains(row.Reason, w.reason) {
			t.Errorf("sample %s: %v, reason %q; want %v with %q", id, row.State, row.Reason, w.state, w.reason)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	var marker, oneTurn int
	for _, b := range sent {
		marker += bytes.Count(b, []byte(`\qmarker`))
		oneTurn += bytes.Count(b, []byte(`one \q turn`))
	}
	if marker == 0 || oneTurn != 0 {
		t.Errorf("the bad escape of the conversation was sent %d times (want it sent as stored), the single turn's %d (want 0: the client refuses it)", marker, oneTurn)
	}
}
