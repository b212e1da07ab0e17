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
	// MultiTurn runs the glaive-shaped conversations (writeConversations)
	// instead of the single prompts; Long the long ones
	// (writeLongConversations).
	MultiTurn bool
	Long      bool
}

// setting is one lane configuration: a fixed number per lane, or auto,
// and the job's balance (tokens or affinity).
type setting struct {
	Short, Long int // 0 = auto
	Balance     string
}

func (s setting) auto() bool { return s.Short == 0 || s.Long == 0 }

func (s setting) String() string {
	lanes := fmt.Sprintf("%d/%d", s.Short, s.Long)
	if s.auto() {
		lanes = "auto"
	}
	if s.Balance != "" {
		lanes += " " + s.Balance
	}
	return lanes
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

var fixedGrid = []setting{{32, 8, ""}, {64, 16, ""}, {100, 20, ""}, {150, 32, ""}, {300, 64, ""}}

// truncateOverride, when >= 0, replaces every workload's Truncate (-truncate).
var truncateOverride = -1.0

// simOverride sets simulator knobs on every server (-sim).
var simOverride map[string]any

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
			Grid: []setting{{32, 8, ""}, {64, 16, ""}, {150, 32, ""}, {300, 64, ""}, {600, 128, ""}}},
		{Name: "kv58k", About: "one server, KV pool 58,000 tokens, outputs mean 2,500 (the small half of the pair)",
			Servers: []server{{KVTokens: 58000}}, OutputMean: 2500, OutputSigma: 0.8, Grid: []setting{{32, 8, ""}, {64, 16, ""}, {150, 32, ""}}},
		{Name: "pair", About: "two servers, KV pools 231,120 and 58,000 tokens, outputs mean 2,500",
			Servers: []server{{KVTokens: 231120}, {KVTokens: 58000}}, OutputMean: 2500, OutputSigma: 0.8,
			Grid: []setting{{150, 32, ""}, {300, 64, ""}}},
		{Name: "mt1", About: "glaive-shaped conversations on one server, KV pool 231,120 tokens",
			Servers: mtServers(1), OutputMean: 300, OutputSigma: 0.8, MultiTurn: true},
		{Name: "mt2", About: "glaive-shaped conversations on two servers, KV pools 231,120 tokens",
			Servers: mtServers(2), OutputMean: 300, OutputSigma: 0.8, MultiTurn: true},
		{Name: "mt4", About: "glaive-shaped conversations on four servers, KV pools 231,120 tokens",
			Servers: mtServers(4), OutputMean: 300, OutputSigma: 0.8, MultiTurn: true},
		{Name: "mtlong", About: "long conversations (8-10 turns, 20 shared system prompts of 2,000-4,000 tokens) on four servers, KV pools 231,120 tokens; a working set several times the pools",
			Servers: mtServers(4), OutputMean: 400, OutputSigma: 0.8, MultiTurn: true, Long: true},
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

func mtServers(n int) []server {
	out := make([]server, n)
	for i := range out {
		out[i] = server{KVTokens: 231120}
	}
	return out
}

// Glaive function calling's shape: every row carries a system prompt that
// lists its functions (1,000-3,000 tokens here), shared word for word by
// the rows drawn with the same functions; 2-6 user turns of a sentence or
// two. The model's answers replace the dataset's.
const (
	mtGroupSize  = 16 // rows per system prompt, on average
	mtMinSysTok  = 1000
	mtMaxSysTok  = 3000
	bytesPerTok  = 4 // the simulator's estimate
	mtMinTurns   = 2
	mtMaxTurns   = 6
	mtMaxUserWds = 60
)

// writeConversations writes n conversations in ShareGPT form with a
// system field, deterministic for seed.
func writeConversations(path string, n int, seed uint64) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create conversations: %w", err)
	}
	w := bufio.NewWriter(f)
	rng := rand.New(rand.NewPCG(seed, seed^0x676c61697665))
	groups := max(n/mtGroupSize, 1)
	systems := make([]string, groups)
	for g := range systems {
		systems[g] = systemPrompt(rng, g)
	}
	enc := json.NewEncoder(w)
	for i := range n {
		turns := mtMinTurns + rng.IntN(mtMaxTurns-mtMinTurns+1)
		var conv []map[string]string
		for k := range turns {
			conv = append(conv,
				map[string]string{"from": "human", "value": fmt.Sprintf("Row %d, question %d: %s", i, k, words(rng, 8+rng.IntN(mtMaxUserWds-8)))},
				map[string]string{"from": "gpt", "value": "the dataset's answer, replaced"})
		}
		row := map[string]any{"id": fmt.Sprintf("c%05d", i), "system": systems[rng.IntN(groups)], "conversations": conv}
		if err := enc.Encode(row); err != nil {
			f.Close()
			return fmt.Errorf("write conversations: %w", err)
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("write conversations: %w", err)
	}
	return f.Close()
}

// systemPrompt is a glaive-style system prompt with function definitions
// of 1,000-3,000 estimated tokens.
func systemPrompt(rng *rand.Rand, g int) string {
	return sizedSystemPrompt(rng, g, mtMinSysTok+rng.IntN(mtMaxSysTok-mtMinSysTok+1))
}

// sizedSystemPrompt is a glaive-style system prompt of about tokens
// estimated tokens.
func sizedSystemPrompt(rng *rand.Rand, g, tokens int) string {
	target := tokens * bytesPerTok
	var b strings.Builder
	fmt.Fprintf(&b, "You are a helpful assistant with access to the following functions (set %d). Use them if required -\n", g)
	for fn := 0; b.Len() < target; fn++ {
		fmt.Fprintf(&b, `{"name": "fn_%d_%d", "description": "%s", "parameters": {"type": "object", "properties": {"%s": {"type": "string", "description": "%s"}}}}`+"\n",
			g, fn, words(rng, 20), vocabulary[rng.IntN(len(vocabulary))], words(rng, 15))
	}
	return b.String()
}

func words(rng *rand.Rand, n int) string {
	var b strings.Builder
	for j := range n {
		if j > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocabulary[rng.IntN(len(vocabulary))])
	}
	return b.String()
}

// The long multi-turn workload (mtlong): few shared system prompts and
// long conversations, so the conversations' histories, not the prompts,
// are what the pools must hold. At 1,200 conversations a finished one is
// about 3,000 tokens of shared prompt and 9 turns of 40-480 words of
// question and about 400 tokens of answer, some 5,000 tokens of its own:
// 6M tokens against four pools of 231,120 (0.92M), six and a half times.
const (
	mtlongGroups   = 20
	mtlongMinSys   = 2000
	mtlongMaxSys   = 4000
	mtlongMinTurns = 8
	mtlongMaxTurns = 10
	mtlongMinWords = 40
	mtlongMaxWords = 480
)

// writeLongConversations writes n long conversations (mtlong) in ShareGPT
// form with a system field, deterministic for seed.
func writeLongConversations(path string, n int, seed uint64) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create long conversations: %w", err)
	}
	w := bufio.NewWriter(f)
	rng := rand.New(rand.NewPCG(seed, seed^0x6c6f6e67))
	systems := make([]string, mtlongGroups)
	for g := range systems {
		systems[g] = sizedSystemPrompt(rng, g, mtlongMinSys+rng.IntN(mtlongMaxSys-mtlongMinSys+1))
	}
	enc := json.NewEncoder(w)
	for i := range n {
		turns := mtlongMinTurns + rng.IntN(mtlongMaxTurns-mtlongMinTurns+1)
		var conv []map[string]string
		for k := range turns {
			conv = append(conv,
				map[string]string{"from": "human", "value": fmt.Sprintf("Row %d, question %d: %s", i, k, words(rng, mtlongMinWords+rng.IntN(mtlongMaxWords-mtlongMinWords+1)))},
				map[string]string{"from": "gpt", "value": "the dataset's answer, replaced"})
		}
		row := map[string]any{"id": fmt.Sprintf("l%05d", i), "system": systems[rng.IntN(mtlongGroups)], "conversations": conv}
		if err := enc.Encode(row); err != nil {
			f.Close()
			return fmt.Errorf("write long conversations: %w", err)
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("write long conversations: %w", err)
	}
	return f.Close()
}
