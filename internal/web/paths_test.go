package web

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// TestOriginsRelativeToJob: origins stored absolute (as every version so
// far stores them) are served relative to the job file's folder, and one
// outside that folder stays absolute (issue 21).
func TestOriginsRelativeToJob(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "web.db"))
	must(t, err)
	t.Cleanup(func() { st.Close() })
	body := []byte(`{"messages":[{"role":"user","content":"hi"}]}`)
	must(t, nil2(st.Ingest(ctx, []store.NewSample{
		{ID: "A/1", Partition: "A", Lane: "short", Origin: "/jobs/demo/data/a.jsonl:1", Body: body},
		{ID: "B/1", Partition: "B", Lane: "short", Origin: "/srv/shared/b.jsonl:2", Body: body},
	})))
	must(t, st.AddIngestErrors(ctx, []store.IngestError{{Partition: "A", Origin: "/jobs/demo/data/a.jsonl:9", Reason: "not JSON"}}))
	report := func(ctx context.Context) (monitor.Report, error) {
		return monitor.Assess(ctx, st, monitor.AssessOptions{Job: "paths"})
	}
	s, err := New(Options{Store: st, Report: report, JobDir: "/jobs/demo"})
	must(t, err)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	getJSON := func(path string, v any) {
		t.Helper()
		code, b := get(t, nil, request(t, "GET", srv.URL+path))
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d\n%s", path, code, b)
		}
		must(t, json.Unmarshal([]byte(b), v))
	}
	var page struct {
		Rows []struct {
			ID     string `json:"id"`
			Origin string `json:"origin"`
		} `json:"rows"`
	}
	getJSON("/api/samples", &page)
	got := map[string]string{}
	for _, r := range page.Rows {
		got[r.ID] = r.Origin
	}
	if diff := cmp.Diff(map[string]string{"A/1": "data/a.jsonl:1", "B/1": "/srv/shared/b.jsonl:2"}, got); diff != "" {
		t.Errorf("/api/samples origins (-want +got):\n%s", diff)
	}
	var one struct {
		Origin string `json:"origin"`
		Review struct {
			Origin string `json:"origin"`
		} `json:"review"`
	}
	getJSON("/api/samples/A/1", &one)
	if one.Origin != "data/a.jsonl:1" || one.Review.Origin != "data/a.jsonl:1" {
		t.Errorf("/api/samples/A/1: origin %q, review origin %q; want data/a.jsonl:1 for both", one.Origin, one.Review.Origin)
	}
	var bad struct {
		First []badRow `json:"first"`
	}
	getJSON("/api/ingest-errors", &bad)
	if len(bad.First) != 1 || bad.First[0].Origin != "data/a.jsonl:9" {
		t.Errorf("/api/ingest-errors = %+v, want origin data/a.jsonl:9", bad.First)
	}
}
