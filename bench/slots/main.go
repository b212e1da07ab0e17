// Command slots measures regen against a slot-bound server: the
// simulator's llama.cpp mode (llama-server with -c 16384 --parallel 8),
// named in the job by URL only. It runs the same job at a fixed
// concurrency equal to the slots, at concurrency: auto with the engine
// detected, and at auto with the endpoint taken for SGLang (what regen did
// before it asked the server), and prints for each: the engine regen used,
// the KV pool it read, the most requests in flight, time to first token
// (p50, p99) and goodput, with the ratios against the fixed cell.
//
//	go run ./bench/slots [-samples 400] [-speed 20]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/regen-dev/regen/bench/internal/bound"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/runner"
	"github.com/regen-dev/regen/internal/sim"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// cell is one way of running the job.
type cell struct {
	name        string
	concurrency string // the lane's concurrency
	engine      string // the endpoint's engine: ("" = detected)
}

// measure is one cell's result.
type measure struct {
	engine          string
	pool            int64
	peak            int64
	ttft50, ttft99  time.Duration
	tokens, samples int
	wall            time.Duration
	bound           bound.Cell // what bound the cell: the server's slots and queue, the process's CPU, the simulator's speed
}

func main() {
	samples := flag.Int("samples", 400, "prompts per job")
	speed := flag.Float64("speed", 20, "simulator speed (simulated seconds per real second)")
	flag.Parse()
	if err := run(*samples, *speed); err != nil {
		fmt.Fprintln(os.Stderr, "slots:", err)
		os.Exit(1)
	}
}

func run(samples int, speed float64) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "regen-slots-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	prompts := filepath.Join(dir, "prompts.jsonl")
	if err := writePrompts(prompts, samples); err != nil {
		return err
	}
	cells := []cell{{"fixed 8", "8", ""}, {"auto, detected", "auto", ""}, {"auto, taken for sglang", "auto", "sglang"}}
	fmt.Printf("regen slots %s: %d prompts of 150-500 words, max_tokens 1024, simulator llama.cpp mode -c 16384 --parallel 8 (2,048 tokens a slot), speed %g\n",
		time.Now().Format("2006-01-02 15:04"), samples, speed)
	var out []measure
	for i, c := range cells {
		fmt.Fprintf(os.Stderr, "%s...\n", c.name)
		m, err := runCell(ctx, filepath.Join(dir, fmt.Sprint(i)), prompts, c, speed)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		out = append(out, m)
	}
	fmt.Println()
	for _, line := range render(cells, out, speed) {
		fmt.Println(line)
	}
	return nil
}

// render is the table: each cell's figures, what bound it, and its
// ratios against the fixed cell, withheld when either was runner-bound;
// then each cell's evidence.
func render(cells []cell, out []measure, speed float64) []string {
	lines := []string{
		fmt.Sprintf("%-24s %-9s %8s %9s %10s %10s %9s %-7s %8s %9s", "cell", "engine", "KV pool", "peak in", "TTFT p50", "TTFT p99", "goodput", "bound", "TTFT", "goodput"),
		fmt.Sprintf("%-24s %-9s %8s %9s %10s %10s %9s %-7s %8s %9s", "", "", "(tokens)", "flight", "(sim)", "(sim)", "(tok/s)", "", "x fixed", "x fixed"),
	}
	base := out[0]
	simTime := func(d time.Duration) time.Duration { return time.Duration(float64(d) * speed).Round(time.Millisecond) }
	goodput := func(m measure) float64 { return float64(m.tokens) / (m.wall.Seconds() * speed) }
	for i, m := range out {
		ratios := fmt.Sprintf("%8.2f %9.2f", float64(m.ttft50)/float64(base.ttft50), goodput(m)/goodput(base))
		sides := []bound.Side{{Name: cells[i].name, Cell: m.bound}}
		if i > 0 {
			sides = append(sides, bound.Side{Name: cells[0].name, Cell: base.bound})
		}
		if why := bound.Withheld(sides...); why != "" {
			ratios = "  " + why
		}
		lines = append(lines, fmt.Sprintf("%-24s %-9s %8d %9d %10s %10s %9.0f %-7s %s", cells[i].name, m.engine, m.pool, m.peak,
			simTime(m.ttft50), simTime(m.ttft99), goodput(m), m.bound.Class, ratios))
	}
	lines = append(lines, "")
	for i, m := range out {
		lines = append(lines, fmt.Sprintf("  %s: bound %s", cells[i].name, m.bound.Evidence()))
	}
	return lines
}

func runCell(ctx context.Context, dir, prompts string, c cell, speed float64) (measure, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return measure{}, err
	}
	srv, url, err := startSlotServer(ctx, speed)
	if err != nil {
		return measure{}, err
	}
	defer srv.Close()
	spec, err := writeCellJob(dir, prompts, url, c, speed)
	if err != nil {
		return measure{}, err
	}
	st, err := sqlite.Open(filepath.Join(dir, "slots.db"))
	if err != nil {
		return measure{}, err
	}
	defer st.Close()

	var m measure
	w := watchEndpoints(ctx, st)
	server := bound.StartWatch(ctx, bound.WatchConfig{URLs: []string{url}, Speed: speed, Slots: slots})
	t0 := time.Now()
	_, err = runner.Run(ctx, runner.Options{Spec: spec, Store: st, Logger: slog.New(slog.DiscardHandler),
		NoExport: true, ProgressEvery: time.Hour, DrainTimeout: time.Second})
	m.wall = time.Since(t0)
	m.bound = server.Stop()
	m.peak, m.pool = w.stop()
	if err != nil {
		return m, err
	}
	if err := readFinished(ctx, st, &m); err != nil {
		return m, err
	}
	m.engine, err = engineUsed(ctx, st, c)
	return m, err
}

// slots is the server's request slots (llama-server --parallel).
const slots = 8

// startSlotServer starts the simulator as llama-server with 8 slots of
// 2,048 tokens and returns it with its URL once it is ready.
func startSlotServer(ctx context.Context, speed float64) (*sim.Server, string, error) {
	cfg := sim.DefaultConfig()
	cfg.ModelName = "qwen3-8b"
	if err := cfg.Apply(map[string]any{"engine": "llamacpp", "parallel": slots, "context_length": 16384, "speed": speed,
		"output_mean": 300, "output_sigma": 0.6, "truncate_fraction": 0, "load_time": "0s", "warmup_time": "0s", "seed": 7,
		// A small model on one GPU: a decode step of ~12 ms.
		"decode_base": "10ms", "decode_per_req": "250us", "prefill_per_ktoken": "60ms"}); err != nil {
		return nil, "", err
	}
	srv, err := sim.New(cfg, io.Discard)
	if err != nil {
		return nil, "", err
	}
	url, err := srv.Start(ctx, "127.0.0.1:0")
	if err != nil {
		srv.Close()
		return nil, "", err
	}
	<-srv.Ready()
	return srv, url, nil
}

// writeCellJob writes the cell's job file into dir and loads it.
func writeCellJob(dir, prompts, url string, c cell, speed float64) (*job.Spec, error) {
	engine := ""
	if c.engine != "" {
		engine = ", engine: " + c.engine
	}
	probe := time.Duration(float64(5*time.Second) / speed).Round(time.Millisecond)
	jobYAML := fmt.Sprintf(`name: slots
model: qwen3-8b
sources: [{partition: p, path: %q, prompt: prompt, id: id}]
lanes: [{name: default, concurrency: %s, max_tokens: 1024}]
endpoints: [{url: %q%s}]
store: {dsn: %q}
monitor: {heartbeat_every: 1s, probe_every: %s}
quality: {truncated: false}
`, prompts, c.concurrency, url, engine, filepath.Join(dir, "slots.db"), probe)
	path := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(path, []byte(jobYAML), 0o644); err != nil {
		return nil, err
	}
	return job.Load(path)
}

// endpointWatch polls the run's status for the most requests in flight
// and the KV pool the endpoints report.
type endpointWatch struct {
	peak, pool atomic.Int64
	cancel     context.CancelFunc
	done       chan struct{}
}

func watchEndpoints(ctx context.Context, st *sqlite.Store) *endpointWatch {
	pollCtx, cancel := context.WithCancel(ctx)
	w := &endpointWatch{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for pollCtx.Err() == nil {
			if rep, err := monitor.Assess(pollCtx, st, monitor.AssessOptions{Now: time.Now(), DeadAfter: time.Minute}); err == nil {
				for _, e := range rep.Endpoints {
					w.peak.Store(max(w.peak.Load(), int64(e.InFlight)))
					if e.KVTokens > 0 {
						w.pool.Store(e.KVTokens)
					}
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	return w
}

// stop ends the polling and returns the peak in flight and the KV pool.
func (w *endpointWatch) stop() (peak, pool int64) {
	w.cancel()
	<-w.done
	return w.peak.Load(), w.pool.Load()
}

// readFinished fills m's samples, tokens and TTFT percentiles from the
// finished samples.
func readFinished(ctx context.Context, st *sqlite.Store, m *measure) error {
	var ttfts []time.Duration
	err := st.Finished(ctx, func(r store.Row) error {
		m.samples++
		m.tokens += r.Result.CompletionTokens
		ttfts = append(ttfts, r.Result.TTFT)
		return nil
	})
	if err != nil {
		return err
	}
	slices.Sort(ttfts)
	if n := len(ttfts); n > 0 {
		m.ttft50, m.ttft99 = ttfts[n/2], ttfts[min(n-1, n*99/100)]
	}
	return nil
}

// engineUsed is the engine the run detected, from its events, else the
// one the cell named ("?" when neither).
func engineUsed(ctx context.Context, st *sqlite.Store, c cell) (string, error) {
	engine := cmpOr(c.engine, "?")
	events, err := st.Events(ctx, 0)
	if err != nil {
		return engine, err
	}
	for _, ev := range events {
		if ev.Kind == "engine" && strings.Contains(ev.Evidence, "detected") {
			engine = strings.Fields(ev.Evidence)[1]
		}
	}
	return engine, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

var words = strings.Fields("the of and to in is was for on that with as by at from this be are or an it which were not have has but its one all their more can also into other some these two may such only first over time new most any when after than them used each where many")

func writePrompts(path string, n int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range n {
		var b strings.Builder
		fmt.Fprintf(&b, "Task %d.", i)
		for range 150 + rng.IntN(351) {
			b.WriteString(" " + words[rng.IntN(len(words))])
		}
		if _, err := fmt.Fprintf(f, "{\"id\":\"s%04d\",\"prompt\":%q}\n", i, b.String()); err != nil {
			return err
		}
	}
	return nil
}
