package runner

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// TestContextKnownBeforeFirstClaim: a llama-server named by URL, without
// /metrics (so no load probe ever reads it), slots of 1,024 tokens, and
// digit-heavy prompts (the simulator at one byte a token, against regen's
// estimate of four). Its context is read when it becomes ready, before
// the first claim: no prompt that cannot fit is ever sent. Prompts whose
// estimate is far past the context are refused on it, those near it are
// counted at the server's POST /tokenize (and only those: short prompts
// cost no tokenizer request), and a digit prompt that fits is sent.
func TestContextKnownBeforeFirstClaim(t *testing.T) {
	rec := recordSim(t, map[string]any{"engine": "llamacpp", "parallel": 2, "context_length": 2048, "bytes_per_token": 1,
		"speed": 50, "output_mean": 40, "load_time": "0s", "warmup_time": "0s"}, "/metrics")
	dir := t.TempDir()
	var b strings.Builder
	line := func(id, prompt string) { fmt.Fprintf(&b, `{"id":%q,"prompt":%q}`+"\n", id, prompt) }
	for i := range 6 {
		line(fmt.Sprintf("short%d", i), fmt.Sprintf("Write a short note about item %d.", i))
	}
	digits := func(tag string, n int) string { return tag + strings.Repeat("31415926535", n/11) }
	for i := range 3 { // ~1,100 tokens, estimated ~275: counted by the tokenizer
		line(fmt.Sprintf("near%d", i), digits(fmt.Sprintf("NEAR%d ", i), 1100))
	}
	for i := range 2 { // ~6,000 tokens, estimated ~1,500 > 1.25 x 1,024
		line(fmt.Sprintf("far%d", i), digits(fmt.Sprintf("FAR%d ", i), 6000))
	}
	line("fits", digits("FITS ", 700)) // ~710 tokens in a 1,024-token slot
	if err := os.WriteFile(filepath.Join(dir, "prompts.jsonl"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := loadJobYAML(t, dir, fmt.Sprintf(`name: ctx
model: m
endpoints: [{url: %q}]
sources: [{partition: p, path: prompts.jsonl, prompt: prompt, id: id}]
lanes: [{name: default, concurrency: 2, max_tokens: 64}]
monitor: {heartbeat_every: 100ms, probe_every: 1h}
quality: {truncated: false}
`, rec.URL))
	st := openStore(t, spec)
	r := startRun(t, spec, st, true)
	if _, err := r.wait(t, 2*time.Minute); err != nil {
		t.Fatalf("run: %v", err)
	}
	for i, body := range rec.bodies() {
		if bytes.Contains(body, []byte("NEAR")) || bytes.Contains(body, []byte("FAR")) {
			t.Errorf("chat request %d sent a prompt that cannot fit: %.80s...", i, body)
		}
	}
	done, dead := 0, map[string]string{}
	for _, row := range finishedRows(t, st) {
		switch row.State {
		case store.Done:
			done++
		case store.Dead:
			dead[row.ID] = row.Reason
		}
	}
	if done != 7 || len(dead) != 5 {
		t.Errorf("%d done, %d dead (%v); want 7 done (6 short, the digit prompt that fits), 5 dead", done, len(dead), dead)
	}
	for id, why := range dead {
		want := "counted by llamacpp's POST /tokenize"
		if strings.Contains(id, "far") {
			want = "prompt of about"
		}
		if !strings.Contains(why, want) || !strings.Contains(why, "1024-token context") || !strings.Contains(why, "not sent") {
			t.Errorf("%s dead: %q; want %q, the 1024-token context, not sent", id, why, want)
		}
	}
	rec.mu.Lock()
	tokenizes := rec.tokenizes
	rec.mu.Unlock()
	if tokenizes != 3 {
		t.Errorf("%d tokenizer requests, want 3 (the prompts near the limit only)", tokenizes)
	}
	t.Logf("%d chat requests, %d tokenizer requests; dead: %v", len(rec.bodies()), tokenizes, dead)
}
