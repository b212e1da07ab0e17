package runner

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/sim"
)

// recordingSim is the simulator behind a handler that keeps the body of
// every chat request it receives.
type recordingSim struct {
	URL    string
	mu     sync.Mutex
	bodies []map[string]any
}

func newRecordingSim(t *testing.T) *recordingSim {
	t.Helper()
	cfg := sim.DefaultConfig()
	cfg.ModelName = "m"
	if err := cfg.Apply(map[string]any{"profile": "fast", "speed": 200, "output_mean": 40, "load_time": "0s", "warmup_time": "0s", "seed": 3}); err != nil {
		t.Fatal(err)
	}
	s, err := sim.New(cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	rec := &recordingSim{}
	h := s.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/chat/completions" {
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			var m map[string]any
			if json.Unmarshal(b, &m) == nil {
				rec.mu.Lock()
				rec.bodies = append(rec.bodies, m)
				rec.mu.Unlock()
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	rec.URL = srv.URL
	return rec
}

// take returns the bodies received so far and forgets them.
func (s *recordingSim) take() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.bodies
	s.bodies = nil
	return out
}

// writeRebuildRows writes n rows holding every field the mappings of
// TestNewConfigRebuildsRequests read.
func writeRebuildRows(t *testing.T, path string, n int) {
	t.Helper()
	var b strings.Builder
	tool := func(name string) []any {
		return []any{map[string]any{"type": "function", "function": map[string]any{"name": name, "parameters": map[string]any{"type": "object"}}}}
	}
	for i := range n {
		row := map[string]any{
			"id": fmt.Sprintf("r%02d", i), "question": fmt.Sprintf("Q%d: what is %d?", i, i), "alt": fmt.Sprintf("A%d: name %d.", i, i),
			"sys":   fmt.Sprintf("SYSTEM: be kind %d", i),
			"msgs":  []any{map[string]any{"role": "user", "content": fmt.Sprintf("M%d", i)}},
			"msgs2": []any{map[string]any{"role": "user", "content": fmt.Sprintf("N%d", i)}},
			"conv":  []any{map[string]any{"from": "human", "value": fmt.Sprintf("C%d", i)}},
			"conv2": []any{map[string]any{"from": "human", "value": fmt.Sprintf("D%d", i)}},
			"tools": tool("old_tool"), "tools2": tool("new_tool"),
			"chat": []any{
				map[string]any{"role": "user", "content": fmt.Sprintf("u1 %d", i)},
				map[string]any{"role": "assistant", "content": fmt.Sprintf("a1 %d", i)},
				map[string]any{"role": "user", "content": fmt.Sprintf("u2 %d", i)},
				map[string]any{"role": "assistant", "content": fmt.Sprintf("a2 %d", i)},
			},
		}
		line, err := json.Marshal(row)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// messagesOf returns the messages of a request body or the conversation of
// an exported ShareGPT record.
func messagesOf(m map[string]any) []map[string]any {
	raw, _ := m["messages"].([]any)
	if raw == nil {
		raw, _ = m["conversations"].([]any)
	}
	out := make([]map[string]any, 0, len(raw))
	for _, x := range raw {
		if mm, ok := x.(map[string]any); ok {
			out = append(out, mm)
		}
	}
	return out
}

// contentOf is the content of the first message with role, "" if none.
func contentOf(m map[string]any, role string) string {
	for _, msg := range messagesOf(m) {
		if msg["role"] == role {
			s, _ := msg["content"].(string)
			return s
		}
	}
	return ""
}

// toolName reads a request's tools (a list) or an exported record's (JSON
// text, the same on every line of a training file).
func toolName(m map[string]any) string {
	tools, _ := m["tools"].([]any)
	if text, ok := m["tools"].(string); ok {
		_ = json.Unmarshal([]byte(text), &tools)
	}
	if len(tools) == 0 {
		return ""
	}
	t, _ := tools[0].(map[string]any)
	f, _ := t["function"].(map[string]any)
	s, _ := f["name"].(string)
	return s
}

// TestNewConfigRebuildsRequests: for every source field in the
// configuration fingerprint, a job run to the end with one value and run
// again with --new-config and another sends only requests built with the
// new value, and its export holds one record per sample, each built with
// the new value: the stored request bodies are rebuilt, and samples whose
// content-hash ids changed do not linger beside the new ones.
func TestNewConfigRebuildsRequests(t *testing.T) {
	const rows = 6
	cases := []struct {
		name     string
		old, new string // the source's mapping
		perRow   int    // samples per row under the new mapping
		// req checks one request the server received, rec one exported record.
		req, rec func(m map[string]any) string
	}{
		{name: "system with an id field", old: `prompt: question, id: id, system: "You are helpful."`,
			new: `prompt: question, id: id, system: "You are terse."`, perRow: 1,
			req: wantContent("system", "You are terse."), rec: wantContent("system", "You are terse.")},
		{name: "system with content-hash ids", old: `prompt: question, system: "You are helpful."`,
			new: `prompt: question, system: "You are terse."`, perRow: 1,
			req: wantContent("system", "You are terse."), rec: wantContent("system", "You are terse.")},
		{name: "prompt", old: `prompt: question`, new: `prompt: alt`, perRow: 1,
			req: wantPrefix("user", "A"), rec: wantPrefix("user", "A")},
		{name: "messages", old: `messages: msgs, id: id`, new: `messages: msgs2, id: id`, perRow: 1,
			req: wantPrefix("user", "N"), rec: wantPrefix("user", "N")},
		{name: "conversations", old: `conversations: conv`, new: `conversations: conv2`, perRow: 1,
			req: wantPrefix("user", "D"), rec: wantPrefix("user", "D")},
		{name: "tools", old: `prompt: question, id: id, tools: tools`, new: `prompt: question, id: id, tools: tools2`, perRow: 1,
			req: wantTool("new_tool"), rec: wantTool("new_tool")},
		{name: "strip_system_prefix", old: `prompt: question, system_field: sys`,
			new: `prompt: question, system_field: sys, strip_system_prefix: "SYSTEM: "`, perRow: 1,
			req: wantPrefix("system", "be kind"), rec: wantPrefix("system", "be kind")},
		// "all" regenerates a1 (a request of one message, then one of three);
		// "last" keeps the dataset's a1 and asks for the last answer only.
		{name: "regenerate", old: `messages: chat, id: id`, new: `messages: chat, id: id, regenerate: last`, perRow: 1,
			req: wantMessages(3), rec: wantSecond("a1 ")},
		{name: "samples_per_prompt", old: `prompt: question, id: id`, new: `prompt: question, id: id, samples_per_prompt: 2`, perRow: 2,
			req: wantSeed, rec: wantCopyID},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newRecordingSim(t)
			dir := t.TempDir()
			writeRebuildRows(t, filepath.Join(dir, "rows.jsonl"), rows)
			job := `name: rebuild
model: m
endpoints: [{url: %q, engine: sglang}]
sources: [{partition: p, path: rows.jsonl, %s}]
lanes: [{name: default, concurrency: 4, max_tokens: 64}]
output: {formats: [sharegpt], metadata: full}
quality: {truncated: false, empty: false, tool_args: false, tool_name: false}
monitor: {heartbeat_every: 100ms}
`
			runTo(t, loadJobYAML(t, dir, fmt.Sprintf(job, srv.URL, tc.old)), false)
			if first := srv.take(); len(first) < rows {
				t.Fatalf("first run sent %d requests, want at least %d", len(first), rows)
			}
			sum := runTo(t, loadJobYAML(t, dir, fmt.Sprintf(job, srv.URL, tc.new)), true)
			reqs := srv.take()
			if len(reqs) < rows*tc.perRow {
				t.Errorf("--new-config run sent %d requests, want at least %d", len(reqs), rows*tc.perRow)
			}
			for i, m := range reqs {
				if problem := tc.req(m); problem != "" {
					t.Errorf("request %d of %d after --new-config: %s\n%v", i+1, len(reqs), problem, m)
				}
			}
			recs := exportedRecords(t, filepath.Join(dir, "out", "data", "rebuild.sharegpt.jsonl"))
			// Done answers cut at max_tokens are in the truncated file beside data/.
			if trunc := filepath.Join(dir, "out", "rebuild.sharegpt.truncated.jsonl"); fileHasLines(trunc) {
				recs = append(recs, exportedRecords(t, trunc)...)
			}
			ids := map[string]bool{}
			for _, m := range recs {
				id, _ := m["id"].(string)
				if ids[id] {
					t.Errorf("record %s exported twice", id)
				}
				ids[id] = true
				if problem := tc.rec(m); problem != "" {
					t.Errorf("exported record %s: %s", id, problem)
				}
				if p, _ := m["provenance"].(map[string]any); p == nil || p["generation"] != float64(2) {
					t.Errorf("exported record %s: provenance %v, want generation 2", id, m["provenance"])
				}
			}
			if len(recs) != rows*tc.perRow {
				t.Errorf("export holds %d records, want %d", len(recs), rows*tc.perRow)
			}
			t.Logf("%s: %d requests, %d records after --new-config; ingest: %s", tc.name, len(reqs), len(recs), sum.Ingest)
		})
	}
}

// runTo runs spec to its end (exported) and fails the test unless it ends done.
func runTo(t *testing.T, spec *job.Spec, newConfig bool) Summary {
	t.Helper()
	st := openStore(t, spec)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sum, err := Run(ctx, Options{Spec: spec, Store: st, Logger: testLogger(t), ProgressEvery: time.Hour,
		DrainTimeout: 2 * time.Second, NewConfig: newConfig})
	if err != nil {
		t.Fatalf("run (new config %v): %v", newConfig, err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	return sum
}

func exportedRecords(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, m)
	}
	return out
}

func wantContent(role, want string) func(map[string]any) string {
	return func(m map[string]any) string {
		if got := contentOf(m, role); got != want {
			return fmt.Sprintf("%s message %q, want %q", role, got, want)
		}
		return ""
	}
}

func wantPrefix(role, prefix string) func(map[string]any) string {
	return func(m map[string]any) string {
		if got := contentOf(m, role); !strings.HasPrefix(got, prefix) {
			return fmt.Sprintf("%s message %q, want it to start with %q", role, got, prefix)
		}
		return ""
	}
}

func wantTool(name string) func(map[string]any) string {
	return func(m map[string]any) string {
		if got := toolName(m); got != name {
			return fmt.Sprintf("tool %q, want %q", got, name)
		}
		return ""
	}
}

func wantMessages(n int) func(map[string]any) string {
	return func(m map[string]any) string {
		if got := len(messagesOf(m)); got != n {
			return fmt.Sprintf("%d messages, want %d", got, n)
		}
		return ""
	}
}

// wantSecond checks the second message's content starts with prefix.
func wantSecond(prefix string) func(map[string]any) string {
	return func(m map[string]any) string {
		msgs := messagesOf(m)
		if len(msgs) < 2 {
			return fmt.Sprintf("%d messages, want at least 2", len(msgs))
		}
		if got, _ := msgs[1]["content"].(string); !strings.HasPrefix(got, prefix) {
			return fmt.Sprintf("second message %q, want the dataset's %q...", got, prefix)
		}
		return ""
	}
}

func wantSeed(m map[string]any) string {
	if _, ok := m["seed"].(float64); !ok {
		return "no seed, want one per sample"
	}
	return ""
}

func wantCopyID(m map[string]any) string {
	id, _ := m["id"].(string)
	if !strings.HasSuffix(id, "#0") && !strings.HasSuffix(id, "#1") {
		return fmt.Sprintf("id %q, want one of two samples of its prompt (#0, #1)", id)
	}
	if _, ok := m["seed"].(float64); !ok {
		return "no seed"
	}
	return ""
}

// A store whose generation was fingerprinted before samples_per_prompt was
// part of the fingerprint, and whose files were ingested with the job's
// samples_per_prompt, holds this very configuration: the re-run takes the
// new fingerprint for the same generation and redoes nothing.
func TestLegacyFingerprintAdopted(t *testing.T) {
	srv := newRecordingSim(t)
	dir := t.TempDir()
	writeRebuildRows(t, filepath.Join(dir, "rows.jsonl"), 4)
	spec := loadJobYAML(t, dir, fmt.Sprintf(`name: legacy
model: m
endpoints: [{url: %q, engine: sglang}]
sources: [{partition: p, path: rows.jsonl, prompt: question, id: id, samples_per_prompt: 2}]
lanes: [{name: default, concurrency: 4, max_tokens: 64}]
output: {formats: [sharegpt]}
quality: {truncated: false, empty: false}
`, srv.URL))
	runTo(t, spec, false)
	srv.take()
	legacy, ok, err := spec.LegacyFingerprint()
	if err != nil || !ok {
		t.Fatalf("LegacyFingerprint = %v, %v; want one for a job with samples_per_prompt 2", ok, err)
	}
	path, _ := spec.Store.SQLitePath()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE generations SET fingerprint = ?, config = ?`, legacy.Hash, legacy.Canonical); err != nil {
		t.Fatal(err)
	}
	db.Close()

	runTo(t, spec, false)
	if n := len(srv.take()); n != 0 {
		t.Errorf("re-run over the legacy fingerprint sent %d requests, want 0", n)
	}
	st := openStore(t, spec)
	gens, err := st.Generations(context.Background())
	fp, _ := spec.Fingerprint()
	if err != nil || len(gens) != 1 || gens[0].Fingerprint != fp.Hash || gens[0].Answers != 8 {
		t.Errorf("generations = %+v, %v; want generation 1 with fingerprint %.12s and its 8 answers", gens, err, fp.Hash)
	}
}

// TestNewConfigKeepsOtherSourcesBadRows: two sources read one file with
// different mappings, each with bad rows of its own; --new-config on one
// source reads the file again for it alone, and the other source's bad
// rows (its file complete, not read again) stay recorded; a row bad for
// both is each one's.
func TestNewConfigKeepsOtherSourcesBadRows(t *testing.T) {
	srv := newRecordingSim(t)
	dir := t.TempDir()
	var b strings.Builder
	for i := range 8 {
		row := map[string]any{"question": fmt.Sprintf("Q%d?", i), "alt": fmt.Sprintf("A%d.", i)}
		switch i % 4 {
		case 1:
			delete(row, "question") // bad for p
		case 3:
			delete(row, "alt") // bad for q
		}
		if i == 5 {
			delete(row, "alt") // bad for both
		}
		line, err := json.Marshal(row)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(append(line, '\n'))
	}
	if err := os.WriteFile(filepath.Join(dir, "rows.jsonl"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	job := `name: twomaps
model: m
endpoints: [{url: %q, engine: sglang}]
sources: [{partition: p, path: rows.jsonl, prompt: question}, {partition: q, path: rows.jsonl, prompt: alt, system: %q}]
lanes: [{name: default, concurrency: 4, max_tokens: 64}]
output: {formats: [sharegpt]}
quality: {truncated: false, empty: false, tool_args: false, tool_name: false}
monitor: {heartbeat_every: 100ms}
`
	want := []string{"p rows.jsonl:2", "p rows.jsonl:6", "q rows.jsonl:4", "q rows.jsonl:6", "q rows.jsonl:8"}
	for i, system := range []string{"You are helpful.", "You are terse."} {
		spec := loadJobYAML(t, dir, fmt.Sprintf(job, srv.URL, system))
		runTo(t, spec, i > 0)
		errs, err := openStore(t, spec).IngestErrors(context.Background(), 0)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range errs {
			got = append(got, e.Partition+" "+e.Origin)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("run %d (q's system %q): bad rows %v, want %v", i+1, system, got, want)
		}
	}
}

// fileHasLines reports whether path exists and is not empty.
func fileHasLines(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.Size() > 0
}
