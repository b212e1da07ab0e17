package runner

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/sim"
)

// TestTokenIDsFollowDetectedEngine: a job that exports token ids and
// names its endpoint by URL only asks each server for ids in the words of
// the engine detected from it, and its records name that engine. The
// simulator in llama.cpp mode (which returns no ids) is sent no SGLang
// field and its records say "unavailable: llamacpp"; in its SGLang mode it
// is sent SGLang's fields and its records carry ids; the dataset card
// names the engine that served. A recording proxy in front of the
// simulator keeps every chat request body.
func TestTokenIDsFollowDetectedEngine(t *testing.T) {
	for _, tc := range []struct {
		mode       string
		wantFields bool   // SGLang's sglext fields on every chat request
		wantIDs    string // "" when every record has input_ids, else its token_ids reason's prefix
	}{
		{"llamacpp", false, "unavailable: llamacpp (turn 1 has no token ids)"},
		{"sglang", true, ""},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			target, bodies := recordedSim(t, tc.mode)
			dir := t.TempDir()
			writePrompts(t, filepath.Join(dir, "prompts.jsonl"), 12)
			spec := loadJobYAML(t, dir, fmt.Sprintf(`name: ids
model: m
endpoints: [{url: %q}]
sources: [{partition: p, path: prompts.jsonl, prompt: prompt, id: id}]
lanes: [{name: default, concurrency: 4, max_tokens: 256}]
monitor: {heartbeat_every: 100ms, probe_every: 100ms}
quality: {truncated: false}
output: {formats: [sharegpt], token_ids: true}
`, target))
			st := openStore(t, spec)
			r := startRun(t, spec, st, false)
			if _, err := r.wait(t, 2*time.Minute); err != nil {
				t.Fatalf("run: %v", err)
			}
			sent := bodies()
			if len(sent) < 12 {
				t.Fatalf("%d chat requests recorded, want at least 12", len(sent))
			}
			for i, b := range sent {
				has := bytes.Contains(b, []byte(`"return_input_ids_in_sglext":true`)) && bytes.Contains(b, []byte(`"return_output_ids_in_sglext":true`))
				if has != tc.wantFields || (!tc.wantFields && bytes.Contains(b, []byte("sglext"))) {
					t.Fatalf("request %d sglext fields %v, want %v: %s", i, has, tc.wantFields, b)
				}
			}
			// A training file is all-ids or no-ids: records without ids go to a
			// file of their own.
			file, other := "data/ids.sharegpt.jsonl", "ids.sharegpt.no-token-ids.jsonl"
			if tc.wantIDs != "" {
				file, other = other, file
			}
			records := readRecords(t, filepath.Join(dir, "out", file))
			if len(records) != 12 {
				t.Fatalf("%d records exported to %s, want 12", len(records), file)
			}
			if _, err := os.Stat(filepath.Join(dir, "out", other)); err == nil {
				if n := len(readRecords(t, filepath.Join(dir, "out", other))); n != 0 {
					t.Errorf("%d records in %s, want none", n, other)
				}
			}
			for _, rec := range records {
				if rec.TokenIDs != tc.wantIDs || (tc.wantIDs == "") != (len(rec.InputIDs) > 0) {
					t.Errorf("%s: token_ids %q with %d input ids; want %q", rec.ID, rec.TokenIDs, len(rec.InputIDs), tc.wantIDs)
				}
			}
			card, err := os.ReadFile(filepath.Join(dir, "out", "README.md"))
			if err != nil || !strings.Contains(string(card), "served by "+tc.mode) {
				t.Errorf("dataset card (%v) does not say it was served by %s:\n%s", err, tc.mode, card)
			}
			t.Logf("%s: %d chat requests, first %d bytes; records' token_ids %q", tc.mode, len(sent), len(sent[0]), records[0].TokenIDs)
		})
	}
}

// simRecorder is a proxy in front of the simulator that keeps the body of
// every chat request and counts the tokenizer requests; routes listed in
// off answer 501, as llama-server does for /metrics without --metrics.
type simRecorder struct {
	URL       string
	mu        sync.Mutex
	chats     [][]byte
	tokenizes int
}

func (r *simRecorder) bodies() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]byte(nil), r.chats...)
}

// recordedSim starts the simulator in mode behind a recording proxy;
// bodies returns the chat request bodies so far.
func recordedSim(t *testing.T, mode string) (proxyURL string, bodies func() [][]byte) {
	rec := recordSim(t, map[string]any{"engine": mode, "speed": 50, "output_mean": 60, "load_time": "0s", "warmup_time": "0s"})
	return rec.URL, rec.bodies
}

func recordSim(t *testing.T, settings map[string]any, off ...string) *simRecorder {
	t.Helper()
	cfg := sim.DefaultConfig()
	cfg.ModelName = "m"
	if err := cfg.UseProfile(sim.ProfileFast); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Apply(settings); err != nil {
		t.Fatal(err)
	}
	s, err := sim.New(cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	simURL, err := s.Start(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(simURL)
	if err != nil {
		t.Fatal(err)
	}
	rec := &simRecorder{}
	proxy := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if slices.Contains(off, r.URL.Path) {
			http.Error(w, `{"error":{"code":501,"message":"This server does not support metrics endpoint. Start it with `+"`--metrics`"+`","type":"not_supported_error"}}`, http.StatusNotImplemented)
			return
		}
		switch {
		case strings.HasSuffix(r.URL.Path, "/chat/completions"):
			b, _ := io.ReadAll(r.Body)
			rec.mu.Lock()
			rec.chats = append(rec.chats, b)
			rec.mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(b))
		case r.URL.Path == "/tokenize":
			rec.mu.Lock()
			rec.tokenizes++
			rec.mu.Unlock()
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	rec.URL = srv.URL
	return rec
}

// exportedRecord is the part of a ShareGPT line the token-id tests read.
type exportedRecord struct {
	ID       string  `json:"id"`
	InputIDs []int32 `json:"input_ids"`
	TokenIDs string  `json:"token_ids"`
}

func readRecords(t *testing.T, path string) []exportedRecord {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []exportedRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var r exportedRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
