package runner

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/sim"
	"github.com/regen-dev/regen/internal/store"
)

// TestLlamaServerByURL: a job that names a llama-server by URL only (the
// simulator's llama.cpp mode, -c 16384 --parallel 8). The engine is
// detected from what the server says, the pool is the 8 slots x 2,048
// tokens of /props, and concurrency: auto never lets more than the 8
// slots' worth of requests in flight. (bench/slots measures its time to
// first token against a fixed limit of 8.)
func TestLlamaServerByURL(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.ModelName = "m"
	if err := cfg.Apply(map[string]any{"profile": "fast", "engine": "llamacpp", "parallel": 8, "context_length": 16384, "speed": 50,
		"output_mean": 200, "load_time": "0s", "warmup_time": "0s"}); err != nil {
		t.Fatal(err)
	}
	s, err := sim.New(cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	url, err := s.Start(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writePrompts(t, filepath.Join(dir, "prompts.jsonl"), 120)
	spec := loadJobYAML(t, dir, fmt.Sprintf(`name: llama
model: m
endpoints: [{url: %q}]
sources: [{partition: p, path: prompts.jsonl, prompt: prompt, id: id}]
lanes: [{name: default, concurrency: auto, max_tokens: 512}]
monitor: {heartbeat_every: 100ms, probe_every: 100ms}
quality: {truncated: false}
`, url))
	st := openStore(t, spec)
	r := startRun(t, spec, st, true)
	seen := watchSlots(t, r, st, 120)
	pool, source, maxLimit, maxInFlight := seen.pool, seen.source, seen.maxLimit, seen.maxInFlight
	if pool != 16384 || source != "server" {
		t.Errorf("KV pool %d tokens (%s), want 16384 (server): 8 slots x 2,048", pool, source)
	}
	if maxLimit > 8 || maxInFlight > 8 || maxLimit == 0 {
		t.Errorf("auto limit reached %d with %d in flight; want at most the 8 slots", maxLimit, maxInFlight)
	}
	var detected string
	for _, e := range events(t, st) {
		if e.Kind == "engine" && e.Subject == url {
			detected = e.Evidence
		}
	}
	if !strings.HasPrefix(detected, "engine llamacpp detected (") {
		t.Errorf("engine event %q, want llamacpp detected with the server's words", detected)
	}
	t.Logf("%s; pool %d (%s); auto limit at most %d, %d in flight at most", detected, pool, source, maxLimit, maxInFlight)
}

// TestSimSlots: the simulator launched in its llama.cpp mode (server:
// {engine: sim, sim: {engine: llamacpp}}), in process and as a supervised
// child, is made ready, probed and read in that mode's words: pool 4 slots
// x 1,024 tokens, auto at the slots.
func TestSimSlots(t *testing.T) {
	for _, command := range []string{"", fmt.Sprintf("\n  command: [%q, sim]", regenBin)} {
		t.Run(map[bool]string{true: "in process", false: "supervised"}[command == ""], func(t *testing.T) { simSlots(t, command) })
	}
}

func simSlots(t *testing.T, command string) {
	dir := t.TempDir()
	writePrompts(t, filepath.Join(dir, "prompts.jsonl"), 60)
	spec := loadJobYAML(t, dir, `name: llama-sim
model: m
server:
  engine: sim`+command+`
  ready_timeout: 30s
  sim: {profile: fast, engine: llamacpp, parallel: 4, context_length: 4096, speed: 50, output_mean: 200}
sources: [{partition: p, path: prompts.jsonl, prompt: prompt, id: id}]
lanes: [{name: default, concurrency: auto, max_tokens: 512}]
monitor: {heartbeat_every: 100ms, probe_every: 100ms}
quality: {truncated: false}
`)
	st := openStore(t, spec)
	r := startRun(t, spec, st, true)
	seen := watchSlots(t, r, st, 60)
	pool, maxLimit := seen.pool, seen.maxLimit
	if pool != 4096 || maxLimit == 0 || maxLimit > 4 {
		t.Errorf("pool %d, auto limit up to %d; want 4096 (4 slots x 1,024) and at most the 4 slots", pool, maxLimit)
	}
}

// slotsSeen is what status showed of the one endpoint while a job ran.
type slotsSeen struct {
	pool                  int64
	source                string
	maxLimit, maxInFlight int
}

// watchSlots follows status until n samples are done and the run ends.
func watchSlots(t *testing.T, r *running, st store.Store, n int) slotsSeen {
	t.Helper()
	var seen slotsSeen
	waitFor(t, r, 2*time.Minute, "the job done", func() bool {
		rep, err := monitor.Assess(context.Background(), st, monitor.AssessOptions{Now: time.Now(), DeadAfter: time.Minute})
		if err != nil {
			return false
		}
		for _, e := range rep.Endpoints {
			if e.KVTokens > 0 {
				seen.pool, seen.source = e.KVTokens, e.KVTokensSource
			}
			seen.maxInFlight = max(seen.maxInFlight, e.InFlight)
			for _, l := range e.Lanes {
				seen.maxLimit = max(seen.maxLimit, l.Limit)
			}
		}
		return rep.Total.Done == n
	})
	if _, err := r.wait(t, time.Minute); err != nil {
		t.Fatalf("run: %v", err)
	}
	return seen
}
