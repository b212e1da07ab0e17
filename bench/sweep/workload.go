package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
)

// server is one simulated endpoint of a workload.
type server struct {
	KVTokens int
	// Sim holds extra simulator knobs (flag names with underscores), e.g.
	// crash faults; the workload's common knobs are added by simKnobs.
	Sim map[string]any
}

// workload is a job and the servers it runs on, with the grid of fixed
// lane settings it is measured at.
type workload struct {
	Name        string
	About       string
	Servers     []server
	OutputMean  int     // simulator's mean output tokens (lognormal)
	OutputSigma float64 // its sigma
	// Truncate is the share of requests that run to max_tokens whatever
	// their lognormal length (the simulator's truncate_fraction). The
	// workloads use 0: each such request is a chain of 10,240 tokens,
	// escalated, then 16,384 more, and in an 800-prompt job the few chains
	// that start last decide when it ends, so identical runs differed by
	// +-4%. Outputs longer than 10,240 tokens by the lognormal still escalate.
	Truncate float64
	Grid     []setting
	// Supervised runs the single server as a regen-launched process (the
	// supervisor, its log watcher and restarts) instead of in-process.
	Supervised bool
}

// setting is one lane configuration: a fixed number per lane, or auto.
type setting struct {
	Short, Long int // 0 = auto
}

func (s setting) auto() bool { return s.Short == 0 || s.Long == 0 }

func (s setting) String() string {
	if s.auto() {
		return "auto"
	}
	return fmt.Sprintf("%d/%d", s.Short, s.Long)
}

// The measurement: 800 prompts of 400-1,400 words, output
// lognormal mean 2,500, lanes short max_tokens 10,240 / long 16,384.
const (
	shortMaxTokens = 10240
	longMaxTokens  = 16384
	// shortMaxPrompt sends prompts estimated above it (about the longest
	// fifth, 1,200+ words) to the long lane; truncated shorts escalate there.
	shortMaxPrompt = 2100
)

var fixedGrid = []setting{{32, 8}, {64, 16}, {100, 20}, {150, 32}, {300, 64}}

// truncateOverride, when >= 0, replaces every workload's Truncate (-truncate).
var truncateOverride = -1.0

// crashOverride replaces knobs of the crash workload's fault (-crash-kv-above, -crash-kv-for).
var crashOverride map[string]any

func workloads() []workload {
	crash := map[string]any{"crash_kv_above": 0.97, "crash_kv_for": "20s", "crash_error": "oom"}
	for k, v := range crashOverride {
		crash[k] = v
	}
	return []workload{
		{Name: "kv231k", About: "one server, KV pool 231,120 tokens (Kimi-K2.5 on 8 x RTX PRO 6000), outputs mean 2,500",
			Servers: []server{{KVTokens: 231120}}, OutputMean: 2500, OutputSigma: 0.8, Grid: fixedGrid},
		{Name: "kv116k", About: "one server, KV pool 116,171 tokens (half the memory for KV), outputs mean 2,500",
			Servers: []server{{KVTokens: 116171}}, OutputMean: 2500, OutputSigma: 0.8, Grid: fixedGrid},
		{Name: "short", About: "one server, KV pool 231,120 tokens, short outputs (mean 300)",
			Servers: []server{{KVTokens: 231120}}, OutputMean: 300, OutputSigma: 0.8,
			Grid: []setting{{32, 8}, {64, 16}, {150, 32}, {300, 64}, {600, 128}}},
		{Name: "kv58k", About: "one server, KV pool 58,000 tokens, outputs mean 2,500 (the small half of the pair)",
			Servers: []server{{KVTokens: 58000}}, OutputMean: 2500, OutputSigma: 0.8, Grid: []setting{{32, 8}, {64, 16}, {150, 32}}},
		{Name: "pair", About: "two servers, KV pools 231,120 and 58,000 tokens, outputs mean 2,500",
			Servers: []server{{KVTokens: 231120}, {KVTokens: 58000}}, OutputMean: 2500, OutputSigma: 0.8,
			Grid: []setting{{150, 32}, {300, 64}}},
		{Name: "crash", About: "one supervised server, KV pool 231,120 tokens, crashes (CUDA OOM) when KV usage stays high",
			Servers: []server{{KVTokens: 231120, Sim: crash}},
			// Truncated requests (2%, the simulator's default) are what keeps
			// KV usage high for long stretches, the pressure this fault needs.
			OutputMean: 2500, OutputSigma: 0.8, Truncate: 0.02, Grid: fixedGrid, Supervised: true},
	}
}

// writePrompts writes n prompts of 400-1,400 words, deterministic for seed.
func writePrompts(path string, n int, seed uint64) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create prompts: %w", err)
	}
	w := bufio.NewWriter(f)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	enc := json.NewEncoder(w)
	for i := range n {
		words := 400 + rng.IntN(1001)
		var b strings.Builder
		fmt.Fprintf(&b, "Task %d. ", i)
		for j := range words {
			if j > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(vocabulary[rng.IntN(len(vocabulary))])
		}
		if err := enc.Encode(map[string]string{"id": fmt.Sprintf("s%04d", i), "prompt": b.String()}); err != nil {
			f.Close()
			return fmt.Errorf("write prompts: %w", err)
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("write prompts: %w", err)
	}
	return f.Close()
}

var vocabulary = strings.Fields(`the of and to in is for that with as on by this be are from at it an or
which data model server memory request token cache batch queue latency throughput scheduler kernel
tensor layer attention prompt output stream limit window pressure balance endpoint lane sample
explain describe compare derive prove implement analyse summarise evaluate function variable
algorithm structure system network storage process thread signal error result value`)
