package web

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/review"
	"github.com/regen-dev/regen/internal/store"
)

// TestSampleFilters lists samples by rule, lane, ended early and
// generation, beside state and partition, page by page, and serves a
// sample's review.
func TestSampleFilters(t *testing.T) {
	ctx := context.Background()
	st, report := fixture(t)
	// A conversation that ended early, with the dataset's answers kept.
	must(t, nil2(st.Ingest(ctx, []store.NewSample{{ID: "M/002", Partition: "M", Lane: "chat", Origin: "m.jsonl:2",
		Body: []byte(`{"messages":[{"role":"user","content":"hi"}],"turns":[{"input":[{"role":"user","content":"more"}]}],` +
			`"original":[[{"role":"assistant","content":"the dataset's hello"}],[{"role":"assistant","content":"the dataset's more"}]]}`)}})))
	c, err := st.Claim(ctx, "chat", 1, "w", time.Minute)
	if err != nil || len(c) != 1 || c[0].ID != "M/002" {
		t.Fatalf("claim M/002: %+v %v", c, err)
	}
	must(t, st.Complete(ctx, "M/002", "w", store.Result{Response: []byte(`{"content":"model hello"}`), FinishReason: "stop",
		PromptTokens: 2, CompletionTokens: 2, Endpoint: "http://127.0.0.1:1", EndReason: "turn 1: the answer called a tool the dataset did not", Generation: 2}))
	s, err := New(Options{Store: st, Report: report})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	list := func(query string) ([]string, string) {
		t.Helper()
		code, body := get(t, nil, request(t, "GET", srv.URL+"/api/samples?"+query))
		if code != 200 {
			t.Fatalf("GET ?%s: %d %s", query, code, body)
		}
		var p struct {
			Rows []sampleRow `json:"rows"`
			Next string      `json:"next"`
		}
		if err := json.Unmarshal([]byte(body), &p); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range p.Rows {
			ids = append(ids, r.ID)
		}
		return ids, p.Next
	}
	tests := []struct {
		query    string
		wantN    int
		wantNext bool
		first    string
	}{
		{"rule=empty", 5, false, "A/095"},
		{"rule=empty&state=rejected&partition=A", 5, false, "A/095"},
		{"rule=repetition", 0, false, ""},
		{"lane=chat", 2, false, "M/001"},
		{"ended=true", 1, false, "M/002"},
		{"ended=1&lane=short", 0, false, ""},
		{"lane=short&state=done&limit=40", 40, true, "A/000"},
		{"generation=2", 1, false, "M/002"},
		{"generation=2&state=done&ended=true", 1, false, "M/002"},
		{"generation=2&lane=short", 0, false, ""},
		{"generation=1", 0, false, ""},
	}
	for _, tt := range tests {
		ids, next := list(tt.query)
		if len(ids) != tt.wantN || (next != "") != tt.wantNext || (tt.first != "" && ids[0] != tt.first) {
			t.Errorf("?%s: %d rows %v, next %q; want %d rows from %q, next %v", tt.query, len(ids), ids, next, tt.wantN, tt.first, tt.wantNext)
		}
	}
	// The next page goes on after the first, without overlap.
	first, next := list("lane=short&state=done&limit=40")
	second, next2 := list("lane=short&state=done&limit=40&after=" + next)
	third, end := list("lane=short&state=done&limit=40&after=" + next2)
	if len(second) != 40 || second[0] == first[len(first)-1] || second[0] != "A/040" || len(third) != 10 || third[0] != "A/080" || end != "" {
		t.Errorf("pages 2 and 3 of the 90 done short samples: %d from %v and %d from %v (next %q), want 40 from A/040 and 10 from A/080",
			len(second), second[:min(len(second), 1)], len(third), third[:min(len(third), 1)], end)
	}
	for _, bad := range []string{"ended=maybe", "generation=0", "generation=two"} {
		if code, _ := get(t, nil, request(t, "GET", srv.URL+"/api/samples?"+bad)); code != 400 {
			t.Errorf("%s: %d, want 400", bad, code)
		}
	}

	var one struct {
		Review *review.Sample `json:"review"`
	}
	_, body := get(t, nil, request(t, "GET", srv.URL+"/api/samples/M/002"))
	if err := json.Unmarshal([]byte(body), &one); err != nil || one.Review == nil {
		t.Fatalf("M/002: %v\n%s", err, body)
	}
	r := one.Review
	if r.EndedEarly == "" || len(r.Turns) != 2 || r.Turns[0].Answer == nil || r.Turns[0].Answer.Content != "model hello" ||
		string(r.Turns[0].Original[0].Content) != `"the dataset's hello"` || r.Turns[1].Answer != nil {
		t.Errorf("review of M/002 = %+v", r)
	}
}
