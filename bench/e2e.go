package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/regen-dev/regen/bench/internal/bound"
	"github.com/regen-dev/regen/internal/dispatch"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/sim"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

const e2eMaxTokens = 1024

func e2eBody(i int) []byte {
	return fmt.Appendf(nil, `{"messages":[{"role":"user","content":"Sample %d: explain one idea from computer networking in two short paragraphs."}]}`, i)
}

// e2eRun is one side's measurement.
type e2eRun struct {
	span     span
	tokens   int64
	inFlight float64 // mean requests in flight
	cell     bound.Cell
}

// benchE2E runs the dispatcher over the SQLite store against the simulator
// and compares it with the same simulator driven by a plain loop of
// concurrent llm.Client.Chat calls that keep nothing: the difference is
// the price of durability and dispatch. Each side gets a fresh simulator
// with the same config, so neither finds the other's prompts in its cache.
func benchE2E(ctx context.Context, o opts) (outcome, error) {
	samples, conc, rounds := 2000, 128, 2
	if o.quick {
		samples, rounds = 500, 1
	}
	step := 500 * time.Microsecond
	c := fastSim(step)
	// Lognormal lengths seeded by request content, so both sides get the
	// same; a narrow spread keeps the last few long answers from deciding
	// the wall time.
	c.OutputMean, c.OutputSigma = 100, 0.4

	var best [2]e2eRun
	for r := range rounds {
		g, err := e2eDispatch(ctx, c, filepath.Join(o.dir, fmt.Sprintf("e2e-%d.db", r)), samples, conc, o.tokenIDs)
		if err != nil {
			return outcome{}, err
		}
		ref, err := e2ePlain(ctx, c, samples, conc)
		if err != nil {
			return outcome{}, err
		}
		// The fastest wall time of each side, and its lowest CPU.
		for i, run := range []e2eRun{g, ref} {
			if r == 0 {
				best[i] = run
				continue
			}
			cpu := min(best[i].span.cpu, run.span.cpu)
			if run.span.wall < best[i].span.wall {
				best[i] = run
			}
			best[i].span.cpu = cpu
		}
	}

	perSec := func(n int64, s span) float64 { return float64(n) / s.wall.Seconds() }
	cpuPer := func(s span) float64 { return float64(s.cpu.Microseconds()) / 1e3 / float64(samples) }
	g, ref := best[0], best[1]
	const note = "same sim config, N plain Chat loops, no store"
	bounds := sides(g.cell, ref.cell)
	detail := []string{fmt.Sprintf("%d samples, lane concurrency %d, max_tokens %d, sim decode step %v real; best of %d; %d vs %d completion tokens; wall %.1f s vs %.1f s; mean requests in flight %.0f vs %.0f",
		samples, conc, e2eMaxTokens, step, rounds, g.tokens, ref.tokens, g.span.wall.Seconds(), ref.span.wall.Seconds(), g.inFlight, ref.inFlight),
		boundDetail(bound.Side{Name: "regen", Cell: g.cell}, bound.Side{Name: "reference", Cell: ref.cell})}
	if g.tokens != ref.tokens {
		detail = append(detail, "token totals differ: the simulator's lengths depend on the request bytes, which differ between the two drivers")
	}
	return outcome{
		rows: []row{
			{name: "e2e samples", unit: "samples/s", better: "higher", regen: perSec(int64(samples), g.span), ref: perSec(int64(samples), ref.span), note: note, sides: bounds},
			{name: "e2e tokens", unit: "tokens/s", better: "higher", regen: perSec(g.tokens, g.span), ref: perSec(ref.tokens, ref.span), note: note, sides: bounds},
			{name: "e2e CPU", unit: "cpu-ms/sample", better: "lower", regen: cpuPer(g.span), ref: cpuPer(ref.span), note: note, sides: bounds},
		},
		detail: detail,
	}, nil
}

// e2eDispatch ingests samples into a new store at path and runs a
// dispatcher over them against a fresh simulator.
func e2eDispatch(ctx context.Context, c sim.Config, path string, samples, conc int, tokenIDs bool) (e2eRun, error) {
	st, err := sqlite.Open(path)
	if err != nil {
		return e2eRun{}, err
	}
	defer st.Close()
	ns := make([]store.NewSample, samples)
	for i := range ns {
		ns[i] = store.NewSample{ID: fmt.Sprintf("p/%06d", i), Partition: "p", Lane: "short", Body: e2eBody(i), PromptTokens: 20, Origin: fmt.Sprintf("p.jsonl:%d", i+1)}
	}
	if _, err := st.Ingest(ctx, ns); err != nil {
		return e2eRun{}, fmt.Errorf("ingest: %w", err)
	}
	s, url, err := startSim(ctx, c)
	if err != nil {
		return e2eRun{}, fmt.Errorf("start sim: %w", err)
	}
	defer s.Close()
	cfg := llm.Config{BaseURL: url, MaxConns: conc}
	if tokenIDs {
		cfg.TokenIDFields = []string{"return_input_ids_in_sglext", "return_output_ids_in_sglext"}
	}
	client := llm.New(cfg)
	defer client.Close()
	d, err := dispatch.New(dispatch.Config{
		Store:     st,
		Owner:     "bench",
		Model:     "m",
		Lanes:     []dispatch.LaneConfig{{Name: "short", Concurrency: conc, MaxTokens: e2eMaxTokens}},
		Endpoints: []dispatch.Endpoint{{URL: url, Client: client}},
	})
	if err != nil {
		return e2eRun{}, err
	}
	t0 := time.Now()
	busy := sampleMean(func() float64 {
		snap := d.Snapshot()
		if len(snap.Lanes) == 0 {
			return 0
		}
		return float64(snap.Lanes[0].InFlight)
	})
	w := bound.StartWatch(ctx, bound.WatchConfig{URLs: []string{url}, Speed: c.Speed})
	s0 := startSpan()
	err = d.Run(ctx)
	run := e2eRun{span: s0.end(), inFlight: busy(), cell: w.Stop()}
	if err != nil {
		return e2eRun{}, fmt.Errorf("dispatch: %w", err)
	}
	if snap := d.Snapshot(); snap.Counters.Done != int64(samples) {
		return e2eRun{}, fmt.Errorf("dispatch finished %d samples, want %d (counters %+v)", snap.Counters.Done, samples, snap.Counters)
	}
	tp, err := st.ThroughputSince(ctx, t0.Add(-time.Second))
	if err != nil {
		return e2eRun{}, fmt.Errorf("throughput: %w", err)
	}
	run.tokens = tp.CompletionTokens
	return run, nil
}

// e2ePlain sends the same samples to a fresh simulator from conc plain
// Chat loops and keeps only the token count.
func e2ePlain(ctx context.Context, c sim.Config, samples, conc int) (e2eRun, error) {
	s, url, err := startSim(ctx, c)
	if err != nil {
		return e2eRun{}, fmt.Errorf("start reference sim: %w", err)
	}
	defer s.Close()
	client := llm.New(llm.Config{BaseURL: url, MaxConns: conc})
	defer client.Close()
	next := make(chan int)
	var mu sync.Mutex
	var tokens int64
	var firstErr error
	var wg sync.WaitGroup
	var inFlight atomic.Int64
	busy := sampleMean(func() float64 { return float64(inFlight.Load()) })
	w := bound.StartWatch(ctx, bound.WatchConfig{URLs: []string{url}, Speed: c.Speed})
	s0 := startSpan()
	for range conc {
		wg.Go(func() {
			for i := range next {
				inFlight.Add(1)
				res, err := client.Chat(ctx, llm.Request{Model: "m", Body: json.RawMessage(e2eBody(i)), MaxTokens: e2eMaxTokens}, func(int) {})
				inFlight.Add(-1)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				tokens += int64(res.Usage.CompletionTokens)
				mu.Unlock()
			}
		})
	}
	for i := range samples {
		next <- i
	}
	close(next)
	wg.Wait()
	run := e2eRun{span: s0.end(), tokens: tokens, inFlight: busy(), cell: w.Stop()}
	if firstErr != nil {
		return e2eRun{}, fmt.Errorf("reference chat: %w", firstErr)
	}
	return run, nil
}

// sampleMean samples f every 5 ms until the returned function is called,
// which returns the mean of the samples.
func sampleMean(f func() float64) func() float64 {
	stop := make(chan struct{})
	done := make(chan float64)
	go func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		var sum float64
		n := 0
		for {
			select {
			case <-stop:
				done <- sum / float64(max(n, 1))
				return
			case <-t.C:
				sum += f()
				n++
			}
		}
	}()
	return func() float64 {
		close(stop)
		return <-done
	}
}
