package runner

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// A job asking output.token_ids from a server that returns none is told at
// the first answer (issue 30 item 8): one token_ids event per endpoint,
// written before the first result was stored, not at the export's end.
func TestAnswerWithoutTokenIDsIsToldAtOnce(t *testing.T) {
	for _, asked := range []bool{true, false} {
		t.Run(fmt.Sprintf("token_ids %v", asked), func(t *testing.T) {
			var sent, calls atomic.Int64
			srv := keepAliveServer(t, "no prompt says this", &sent, &calls) // answers every prompt, no ids
			dir := t.TempDir()
			writePrompts(t, filepath.Join(dir, "prompts.jsonl"), 10)
			spec := loadJobYAML(t, dir, fmt.Sprintf(`name: ids
model: m
endpoints: [{url: %q, engine: sglang}]
sources: [{partition: p, path: prompts.jsonl, prompt: prompt, id: id}]
lanes: [{name: default, concurrency: 1, max_tokens: 64}]
output: {token_ids: %v}
monitor: {heartbeat_every: 100ms, dead_after: 5s, stall_after: 60s}
`, srv.URL, asked))
			st := openStore(t, spec)
			if _, err := startRun(t, spec, st, true).wait(t, time.Minute); err != nil {
				t.Fatalf("run: %v", err)
			}
			var first time.Time
			for _, r := range finishedRows(t, st) {
				if r.State == store.Done && (first.IsZero() || r.FinishedAt.Before(first)) {
					first = r.FinishedAt
				}
			}
			var told []store.Event
			for _, e := range events(t, st) {
				if e.Kind == "token_ids" {
					told = append(told, e)
				}
			}
			if !asked {
				if len(told) != 0 {
					t.Errorf("token_ids events %+v for a job that did not ask for ids", told)
				}
				return
			}
			if len(told) != 1 || told[0].Subject != srv.URL || !strings.Contains(told[0].Evidence, "first answer") {
				t.Fatalf("token_ids events %+v: want one for %s at its first answer", told, srv.URL)
			}
			if told[0].Time.After(first) {
				t.Errorf("told at %s, after the first result was stored at %s", told[0].Time.Format(time.StampMicro), first.Format(time.StampMicro))
			}
			t.Logf("told %s before the first result was stored: %s", first.Sub(told[0].Time), told[0].Evidence)
		})
	}
}
