package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/regen-dev/regen/internal/dispatch"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

const e2eMaxTokens = 1024

func e2eBody(i int) []byte {
	return fmt.Appendf(nil, `{"messages":[{"role":"user","content":"Sample %d: explain one idea from computer networking in two short paragraphs."}]}`, i)
}

// benchE2E runs the dispatcher over the SQLite store against the simulator
// and compares it with the same simulator driven by a plain loop of
// concurrent llm.Client.Chat calls that keep nothing: the difference is
// the price of durability and dispatch.
func benchE2E(ctx context.Context, o opts) (outcome, error) {
	samples, conc := 2000, 128
	if o.quick {
		samples = 500
	}
	step := 500 * time.Microsecond
	c := fastSim(step)
	// Lognormal lengths seeded by request content, so both sides get the
	// same; a narrow spread keeps the last few long answers from deciding
	// the wall time.
	c.OutputMean, c.OutputSigma = 100, 0.4

	// regen: store + dispatcher.
	st, err := sqlite.Open(filepath.Join(o.dir, "e2e.db"))
	if err != nil {
		return outcome{}, err
	}
	defer st.Close()
	ns := make([]store.NewSample, samples)
	for i := range ns {
		ns[i] = store.NewSample{ID: fmt.Sprintf("p/%06d", i), Partition: "p", Lane: "short", Body: e2eBody(i), PromptTokens: 20, Origin: fmt.Sprintf("p.jsonl:%d", i+1)}
	}
	if _, err := st.Ingest(ctx, ns); err != nil {
		return outcome{}, fmt.Errorf("ingest: %w", err)
	}
	s, url, err := startSim(ctx, c)
	if err != nil {
		return outcome{}, fmt.Errorf("start sim: %w", err)
	}
	client := llm.New(llm.Config{BaseURL: url, MaxConns: conc})
	d, err := dispatch.New(dispatch.Config{
		Store:     st,
		Owner:     "bench",
		Model:     "m",
		Lanes:     []dispatch.LaneConfig{{Name: "short", Concurrency: conc, MaxTokens: e2eMaxTokens}},
		Endpoints: []dispatch.Endpoint{{URL: url, Client: client}},
	})
	if err != nil {
		s.Close()
		return outcome{}, err
	}
	t0 := time.Now()
	regenBusy := sampleMean(func() float64 {
		snap := d.Snapshot()
		if len(snap.Lanes) == 0 {
			return 0
		}
		return float64(snap.Lanes[0].InFlight)
	})
	s0 := startSpan()
	err = d.Run(ctx)
	regenSpan := s0.end()
	regenInFlight := regenBusy()
	client.Close()
	s.Close()
	if err != nil {
		return outcome{}, fmt.Errorf("dispatch: %w", err)
	}
	snap := d.Snapshot()
	if snap.Counters.Done != int64(samples) {
		return outcome{}, fmt.Errorf("dispatch finished %d samples, want %d (counters %+v)", snap.Counters.Done, samples, snap.Counters)
	}
	tp, err := st.ThroughputSince(ctx, t0.Add(-time.Second))
	if err != nil {
		return outcome{}, fmt.Errorf("throughput: %w", err)
	}
	regenTokens := tp.CompletionTokens

	// reference: the same simulator, conc plain Chat loops, nothing stored.
	s, url, err = startSim(ctx, c)
	if err != nil {
		return outcome{}, fmt.Errorf("start reference sim: %w", err)
	}
	refClient := llm.New(llm.Config{BaseURL: url, MaxConns: conc})
	next := make(chan int)
	var mu sync.Mutex
	var refTokens int64
	var refErr error
	var wg sync.WaitGroup
	var inFlight atomic.Int64
	refBusy := sampleMean(func() float64 { return float64(inFlight.Load()) })
	s0 = startSpan()
	for range conc {
		wg.Go(func() {
			for i := range next {
				inFlight.Add(1)
				res, err := refClient.Chat(ctx, llm.Request{Model: "m", Body: json.RawMessage(e2eBody(i)), MaxTokens: e2eMaxTokens}, func(int) {})
				mu.Lock()
				if err != nil && refErr == nil {
					refErr = err
				}
				refTokens += int64(res.Usage.CompletionTokens)
				mu.Unlock()
				inFlight.Add(-1)
			}
		})
	}
	for i := range samples {
		next <- i
	}
	close(next)
	wg.Wait()
	refSpan := s0.end()
	refInFlight := refBusy()
	refClient.Close()
	s.Close()
	if refErr != nil {
		return outcome{}, fmt.Errorf("reference chat: %w", refErr)
	}

	perSec := func(n int64, s span) float64 { return float64(n) / s.wall.Seconds() }
	cpuPer := func(s span) float64 { return float64(s.cpu.Microseconds()) / 1e3 / float64(samples) }
	const note = "same sim, N plain Chat loops, no store"
	detail := []string{fmt.Sprintf("%d samples, lane concurrency %d, max_tokens %d, sim decode step %v real; %d vs %d completion tokens; wall %.1f s vs %.1f s; mean requests in flight %.0f vs %.0f",
		samples, conc, e2eMaxTokens, step, regenTokens, refTokens, regenSpan.wall.Seconds(), refSpan.wall.Seconds(), regenInFlight, refInFlight)}
	if regenTokens != refTokens {
		detail = append(detail, "token totals differ: the simulator's lengths depend on the request bytes, which differ between the two drivers")
	}
	return outcome{
		rows: []row{
			{name: "e2e samples", unit: "samples/s", better: "higher", regen: perSec(int64(samples), regenSpan), ref: perSec(int64(samples), refSpan), note: note},
			{name: "e2e tokens", unit: "tokens/s", better: "higher", regen: perSec(regenTokens, regenSpan), ref: perSec(refTokens, refSpan), note: note},
			{name: "e2e CPU", unit: "cpu-ms/sample", better: "lower", regen: cpuPer(regenSpan), ref: cpuPer(refSpan), note: note},
		},
		detail: detail,
	}, nil
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
