package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/regen-dev/regen/bench/internal/bound"
	"github.com/regen-dev/regen/internal/capture"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/reply"
	"github.com/regen-dev/regen/internal/sim"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// captureRounds: each side runs this often, alternating; the report gives
// the median and the range.
const captureRounds = 3

// benchCapture measures the hidden-state capture of n done samples
// against the vLLM simulator writing their files (3 layers of 64, bf16,
// about 300 tokens: ~115 kB each): capture.Run (claim, send, wait for
// the writer's lock, check and hash the file, place it, record it) against
// a plain client sending the same requests at the same concurrency and
// deleting each file it is named.
func benchCapture(ctx context.Context, o opts) (outcome, error) {
	n, conc := 600, 8
	if o.quick {
		n = 200
	}
	c := fastSim(time.Millisecond)
	c.Engine = sim.EngineVLLM
	c.HiddenStates, c.HiddenSize, c.HiddenLayers, c.HiddenDType = filepath.Join(o.dir, "capture-server"), 64, 3, "bf16"
	s, url, err := startSim(ctx, c)
	if err != nil {
		return outcome{}, err
	}
	defer s.Close()
	st, ids, err := captureStore(ctx, filepath.Join(o.dir, "capture.db"), n)
	if err != nil {
		return outcome{}, err
	}
	defer st.Close()
	var regen, ref, regenCPU, refCPU []float64
	var regenCells, refCells []bound.Cell
	watch := bound.WatchConfig{URLs: []string{url}, Speed: c.Speed}
	for range captureRounds {
		w := bound.StartWatch(ctx, watch)
		sp, err := captureRegenRound(ctx, st, url, filepath.Join(o.dir, "capture-job"), conc)
		regenCells = append(regenCells, w.Stop())
		if err != nil {
			return outcome{}, err
		}
		regen, regenCPU = append(regen, float64(n)/sp.wall.Seconds()), append(regenCPU, float64(sp.cpu.Microseconds())/float64(n))
		w = bound.StartWatch(ctx, watch)
		sp, err = capturePlainRound(ctx, url, ids, conc)
		refCells = append(refCells, w.Stop())
		if err != nil {
			return outcome{}, err
		}
		ref, refCPU = append(ref, float64(n)/sp.wall.Seconds()), append(refCPU, float64(sp.cpu.Microseconds())/float64(n))
	}
	regenCell, refCell := bound.Merge(regenCells...), bound.Merge(refCells...)
	return outcome{
		rows: []row{
			{name: "capture samples", unit: "samples/s", better: "higher", regen: median(regen), ref: median(ref),
				note: "a plain client sending the same requests (no check, hash, place or record)", sides: sides(regenCell, refCell)},
			{name: "capture CPU", unit: "µs/sample", better: "lower", regen: median(regenCPU), ref: median(refCPU),
				note: "the same plain client (both include the in-process simulator)", sides: sides(regenCell, refCell)},
		},
		detail: []string{
			// The ratio of the medians is the table's (withheld there when runner-bound).
			fmt.Sprintf("%d samples, concurrency %d, %d rounds each, alternating: capture %s samples/s, plain %s",
				n, conc, captureRounds, spread(regen), spread(ref)),
			boundDetail(bound.Side{Name: "capture", Cell: regenCell}, bound.Side{Name: "plain", Cell: refCell}) + " (means over the rounds)",
		},
	}, nil
}

// captureStore is a store of n done samples with token ids, and the ids.
func captureStore(ctx context.Context, path string, n int) (*sqlite.Store, [][]int64, error) {
	st, err := sqlite.Open(path)
	if err != nil {
		return nil, nil, err
	}
	var in []store.NewSample
	for i := range n {
		id := fmt.Sprintf("p/%05d", i)
		in = append(in, store.NewSample{ID: id, Partition: "p", Lane: "l", Body: []byte(`{"messages":[{"role":"user","content":"x"}]}`), Origin: "p:" + id})
	}
	if _, err := st.Ingest(ctx, in); err != nil {
		return nil, nil, err
	}
	claimed, err := st.Claim(ctx, "l", n, "gen", time.Hour)
	if err != nil {
		return nil, nil, err
	}
	all := make([][]int64, 0, n)
	for i, c := range claimed {
		prompt, completion := make([]int32, 256+i%64), make([]int32, 32)
		for j := range prompt {
			prompt[j] = int32(100 + (i+j)%30000)
		}
		for j := range completion {
			completion[j] = int32(200 + (i*j)%30000)
		}
		res := llm.Result{Content: "x", FinishReason: "stop", PromptTokenIDs: prompt, CompletionTokenIDs: completion,
			Usage: llm.Usage{PromptTokens: len(prompt), CompletionTokens: len(completion)}}
		if err := st.Complete(ctx, c.ID, "gen", store.Result{Response: reply.Encode(res, "http://gen", store.Provenance{}),
			FinishReason: "stop", PromptTokens: len(prompt), CompletionTokens: len(completion)}); err != nil {
			return nil, nil, err
		}
		ids := make([]int64, 0, len(prompt)+len(completion))
		for _, id := range append(prompt, completion...) {
			ids = append(ids, int64(id))
		}
		all = append(all, ids)
	}
	return st, all, nil
}

// captureRegenRound captures every sample into a fresh folder, the
// table emptied first.
func captureRegenRound(ctx context.Context, st *sqlite.Store, url, jobDir string, conc int) (span, error) {
	if _, err := st.DB().ExecContext(ctx, `DELETE FROM captures`); err != nil {
		return span{}, err
	}
	if err := os.RemoveAll(jobDir); err != nil {
		return span{}, err
	}
	cfg := capture.Config{Dir: filepath.Join(jobDir, "hidden_states"), JobDir: jobDir, Concurrency: conc, MaxAttempts: 1, Owner: "bench",
		Endpoints: []capture.Endpoint{{URL: url, Client: &capture.VLLM{URL: url, Model: "m", HTTP: &http.Client{}}}}}
	sp := startSpan()
	sum, err := capture.Run(ctx, st, cfg)
	out := sp.end()
	if err == nil {
		err = sum.Err()
	}
	if err == nil && sum.Captured != sum.Rows {
		err = fmt.Errorf("captured %d of %d", sum.Captured, sum.Rows)
	}
	return out, err
}

// capturePlainRound sends every sample's request from conc goroutines,
// reads the answer's path and deletes the file and its lock.
func capturePlainRound(ctx context.Context, url string, ids [][]int64, conc int) (span, error) {
	hc := &http.Client{}
	next := make(chan []int64)
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	sp := startSpan()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range next {
				if err := plainCapture(ctx, hc, url, p); err != nil {
					mu.Lock()
					first = cmpErr(first, err)
					mu.Unlock()
				}
			}
		}()
	}
	for _, p := range ids {
		next <- p
	}
	close(next)
	wg.Wait()
	return sp.end(), first
}

func plainCapture(ctx context.Context, hc *http.Client, url string, ids []int64) error {
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": ids, "max_tokens": 1, "return_token_ids": true})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	var a struct {
		KV struct {
			Path string `json:"hidden_states_path"`
		} `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(raw, &a); err != nil || a.KV.Path == "" {
		return fmt.Errorf("plain capture: no path in %.200s", raw)
	}
	os.Remove(a.KV.Path + ".lock")
	return os.Remove(a.KV.Path)
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// spread is "median (min-max)".
func spread(v []float64) string {
	return fmt.Sprintf("%s (%s-%s)", num(median(v)), num(slices.Min(v)), num(slices.Max(v)))
}
