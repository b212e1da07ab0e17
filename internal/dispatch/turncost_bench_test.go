//go:build unix

package dispatch

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/reply"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// The runner's cost of one turn should not grow with the conversation's
// history beyond sending it: BenchmarkTurnCost runs the real dispatcher,
// the real SQLite store and the real client against a stand-in server that
// answers every request at once with the same short stream, over samples
// waiting at their fourth turn with 1k, 4k or 16k tokens of history (half
// in the sample's body, half in the three answers the store holds), and
// reports the process's CPU per turn (user+system, steadier than wall time
// on a shared machine). The floor sub-benchmarks post the same request
// bytes with plain net/http at the same concurrency: the part of the cost
// that must grow with the history (writing it to the socket, the stand-in
// reading it).
//
//	go test -run '^$' -bench TurnCost -benchtime 3x ./internal/dispatch/
//
// -cpuprofile would mostly profile the setup (ingest and the three stored
// turns); with REGEN_TURNCOST_PROFILE=dir each measured run alone
// is profiled into dir/turncost-<history|conv>-<k>k-<run>.cpu.
//
// The conv sub-benchmarks run whole conversations in one dispatcher
// (benchConversations): their next turns reuse what the turn before built
// (history.go) and are claimed without their body and answers
// (store.Queue.ClaimKept), where history=Nk builds its turn from the store
// alone.
//
// Last measured (2026-12-06, 2 cores, one run at a time; nine runs
// interleaved with b8e5255, the tree before the body check, the copies and
// the history reads below were removed; medians with ranges, cpu-µs per
// turn at 1k / 4k / 16k tokens): conv 219 (196-288) / 253 (214-291) / 294
// (254-379), before 259 (229-288) / 294 (236-318) / 369 (324-440); 16k/1k
// 1.34 (per run median 1.30, 1.02-1.56), before 1.42; floor 45 (40-53) /
// 60 (54-74) / 86 (74-144), before 53 / 68 / 91 (the same code: the
// spread is the machine's). The runner's own growth, (conv 16k - conv 1k)
// - (floor 16k - floor 1k): 34 µs (per run median 24, -38 to 51), before
// 72; its own ratio (conv - floor at 16k) / (conv - floor at 1k) 1.20 (per
// run median 1.14), before 1.35. Allocated per run (1,200 turns): 36 / 44
// / 77 MB, before 47 / 85 / 194. kept/next-turn 1.00 (0.997-1.000).
// history= 310 (269-359) / 366 (316-528) / 600 (531-665), before 349 /
// 411 / 636.

const (
	turnCostSamples = 300
	turnCostConc    = 32
	turnCostTurn    = 3 // the turn measured (0-based): three answers stored before it
)

// costTokens are the history sizes measured, in tokens of about 4 bytes.
var costTokens = []int{1000, 4000, 16000}

func BenchmarkTurnCost(b *testing.B) {
	for _, tokens := range costTokens {
		b.Run(fmt.Sprintf("history=%dk", tokens/1000), func(b *testing.B) { benchTurns(b, tokens) })
		b.Run(fmt.Sprintf("conv=%dk", tokens/1000), func(b *testing.B) { benchConversations(b, tokens) })
		b.Run(fmt.Sprintf("floor=%dk", tokens/1000), func(b *testing.B) { benchTurnFloor(b, tokens) })
	}
}

// benchConversations runs whole conversations in one dispatcher, as a job
// without restarts does: turnCostSamples samples of turnCostTurn+1 turns
// whose opening messages hold the history (a long system prompt and first
// message, tokens*4 bytes), short next inputs and short answers, so every
// turn carries about tokens of history; it reports CPU per turn over all
// turns, the first (built from the body) included. Each next turn is built
// from what the turn before kept (history.go); history=Nk measures the
// turn built from the store alone, as after a restart.
func benchConversations(b *testing.B, tokens int) {
	srv := standIn(b)
	var cpu time.Duration
	var reused, kept int64
	turns := turnCostTurn + 1
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		st := convStore(b, filepath.Join(b.TempDir(), fmt.Sprintf("conv-%d.db", i)), tokens)
		// A pool that keeps every conversation warm: admission holds them all.
		d, spent := measuredRun(b, srv.URL, st, tokens, i, float64(4*turnCostSamples*tokens))
		cpu += spent
		reused += d.historyReused.Load()
		kept += d.keptClaims.Load()
		st.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*turnCostSamples*turns), "cpu-µs/turn")
	b.ReportMetric(float64(reused)/float64(b.N*turnCostSamples*(turns-1)), "reused/next-turn")
	b.ReportMetric(float64(kept)/float64(b.N*turnCostSamples*(turns-1)), "kept/next-turn")
}

// convBody is sample i's body for benchConversations.
func convBody(i, tokens int) []byte {
	msg := func(role string, k, n int) conversation.Message {
		c, _ := conversation.NewEncoder().Raw(historyText(uint64(i*16+k), n))
		return conversation.Message{Role: role, Content: bytes.Clone(c)}
	}
	body := conversation.Body{Messages: []conversation.Message{msg("system", 0, tokens*2), msg("user", 1, tokens*2)}}
	for k := range turnCostTurn {
		body.Turns = append(body.Turns, conversation.Turn{Input: []conversation.Message{msg("user", 2+k, 200)}})
	}
	return conversation.Encode(&body)
}

// convStore is a new SQLite store at path holding turnCostSamples samples
// of convBody at their first turn.
func convStore(b *testing.B, path string, tokens int) *sqlite.Store {
	st, err := sqlite.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	ns := make([]store.NewSample, turnCostSamples)
	for i := range ns {
		ns[i] = store.NewSample{ID: fmt.Sprintf("s-%05d", i), Partition: "p", Lane: "short", Body: convBody(i, tokens), PromptTokens: tokens, Origin: fmt.Sprintf("p.jsonl:%d", i+1)}
	}
	if _, err := st.Ingest(context.Background(), ns); err != nil {
		b.Fatal(err)
	}
	return st
}

func benchTurns(b *testing.B, tokens int) {
	srv := standIn(b)
	var cpu time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		st := historyStore(b, filepath.Join(b.TempDir(), fmt.Sprintf("job-%d.db", i)), tokens)
		_, spent := measuredRun(b, srv.URL, st, tokens, i, 0)
		cpu += spent
		st.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*turnCostSamples), "cpu-µs/turn")
}

// benchTurnFloor posts the request bytes of the measured turn (built once)
// with plain net/http and reads the answer without parsing it: what
// sending that history costs at the least.
func benchTurnFloor(b *testing.B, tokens int) {
	srv := standIn(b)
	p, err := conversation.Decode(historyBody(0, tokens))
	if err != nil {
		b.Fatal(err)
	}
	body, err := p.Request(turnCostTurn, historyAnswers(0, tokens), false)
	if err != nil {
		b.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: turnCostConc}}
	defer hc.CloseIdleConnections()
	var cpu time.Duration
	for b.Loop() {
		c0 := processCPU()
		next := make(chan struct{})
		var wg sync.WaitGroup
		for range turnCostConc {
			wg.Go(func() {
				for range next {
					resp, err := hc.Post(srv.URL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
					if err != nil {
						b.Error(err)
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		}
		for range turnCostSamples {
			next <- struct{}{}
		}
		close(next)
		wg.Wait()
		cpu += processCPU() - c0
	}
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*turnCostSamples), "cpu-µs/turn")
}

// standInStream is the stand-in's answer: a role chunk, 20 content chunks,
// a finish chunk with usage.
var standInStream = func() []byte {
	var s bytes.Buffer
	s.WriteString("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
	for i := range 20 {
		fmt.Fprintf(&s, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" word%d\"}}]}\n\n", i)
	}
	s.WriteString("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":900,\"completion_tokens\":20,\"total_tokens\":920}}\n\n")
	s.WriteString("data: [DONE]\n\n")
	return s.Bytes()
}()

// standIn answers every chat request at once with standInStream.
func standIn(b *testing.B) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(standInStream)
	}))
	b.Cleanup(srv.Close)
	return srv
}

// historyText is n bytes of prose-like text (words, punctuation, the odd
// quote and newline that JSON escapes), different for every seed.
func historyText(seed uint64, n int) string {
	words := []string{"the", "model", "answers", "with", "a", "list:", "\"quoted\"", "token", "cache,", "server", "prefix.", "\n", "regen", "keeps", "every", "result", "<tag>", "é"}
	r := rand.New(rand.NewPCG(seed, 7))
	var s strings.Builder
	for s.Len() < n {
		s.WriteString(words[r.IntN(len(words))])
		s.WriteByte(' ')
	}
	return s.String()
}

// historyBody is sample i's body: a system prompt and four user turns,
// half of a history of tokens*4 bytes.
func historyBody(i, tokens int) []byte {
	part := tokens * 4 / 10
	msg := func(role string, k int) conversation.Message {
		c, _ := conversation.NewEncoder().Raw(historyText(uint64(i*16+k), part))
		return conversation.Message{Role: role, Content: bytes.Clone(c)}
	}
	body := conversation.Body{Messages: []conversation.Message{msg("system", 0), msg("user", 1)}}
	for k := range turnCostTurn {
		body.Turns = append(body.Turns, conversation.Turn{Input: []conversation.Message{msg("user", 2+k)}})
	}
	return conversation.Encode(&body)
}

// historyAnswers are sample i's stored answers to its first three turns,
// the other half of the history.
func historyAnswers(i, tokens int) []llm.Result {
	var out []llm.Result
	for k := range turnCostTurn {
		content := historyText(uint64(i*16+8+k), tokens*4/2/turnCostTurn)
		out = append(out, llm.Result{Content: content, FinishReason: "stop", Model: "m",
			Usage: llm.Usage{PromptTokens: tokens / 2, CompletionTokens: len(content) / 4}})
	}
	return out
}

// historyStore is a new SQLite store at path holding turnCostSamples
// samples waiting at turn turnCostTurn, their earlier answers stored.
func historyStore(b *testing.B, path string, tokens int) *sqlite.Store {
	ctx := context.Background()
	st, err := sqlite.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	ns := make([]store.NewSample, turnCostSamples)
	answers := make(map[string][]llm.Result, turnCostSamples)
	for i := range ns {
		id := fmt.Sprintf("s-%05d", i)
		ns[i] = store.NewSample{ID: id, Partition: "p", Lane: "short", Body: historyBody(i, tokens), PromptTokens: tokens / 2, Origin: fmt.Sprintf("p.jsonl:%d", i+1)}
		answers[id] = historyAnswers(i, tokens)
	}
	if _, err := st.Ingest(ctx, ns); err != nil {
		b.Fatal(err)
	}
	for turn := range turnCostTurn {
		claimed, err := st.Claim(ctx, "short", turnCostSamples, "setup", time.Hour)
		if err != nil || len(claimed) != turnCostSamples {
			b.Fatalf("setup claim at turn %d: %d claimed, %v", turn, len(claimed), err)
		}
		for _, c := range claimed {
			res := answers[c.ID][turn]
			r := store.Result{Response: reply.Encode(res, "http://standin", store.Provenance{}), FinishReason: res.FinishReason,
				PromptTokens: res.Usage.PromptTokens, CompletionTokens: res.Usage.CompletionTokens, Endpoint: "http://standin", Turn: turn}
			if err := st.CompleteTurn(ctx, c.ID, "setup", r, ""); err != nil {
				b.Fatal(err)
			}
		}
	}
	return st
}

// profileRun starts a CPU profile of one run when REGEN_TURNCOST_PROFILE
// names a directory, and returns what stops it; the file is named after
// the sub-benchmark (history=16k -> turncost-history-16k-<run>.cpu).
func profileRun(b *testing.B, tokens, run int) func() {
	dir := os.Getenv("REGEN_TURNCOST_PROFILE")
	if dir == "" {
		return func() {}
	}
	kind, _, _ := strings.Cut(b.Name()[strings.LastIndexByte(b.Name(), '/')+1:], "=")
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("turncost-%s-%dk-%d.cpu", kind, tokens/1000, run)))
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

// processCPU is this process's user+system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// measuredRun runs a dispatcher over st against the stand-in at url with
// the timer on (it is off on entry and on return) and returns it with the
// process CPU the run took; pool, when set, is the endpoint's KV pool.
func measuredRun(b *testing.B, url string, st store.Store, tokens, i int, pool float64) (*Dispatcher, time.Duration) {
	client := llm.New(llm.Config{BaseURL: url, MaxConns: turnCostConc})
	defer client.Close()
	cfg := baseConfig(st, []Endpoint{{URL: url, Client: client}})
	cfg.Owner = "bench"
	cfg.Lanes[0].Concurrency = turnCostConc
	d, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if pool > 0 {
		d.SetCapacity(url, pool, CapacityJob)
	}
	stopProfile := profileRun(b, tokens, i)
	b.StartTimer()
	c0 := processCPU()
	if err := d.Run(context.Background()); err != nil {
		b.Fatal(err)
	}
	spent := processCPU() - c0
	b.StopTimer()
	stopProfile()
	if got := d.Snapshot().Counters.Done; got != turnCostSamples {
		b.Fatalf("%d samples done, want %d", got, turnCostSamples)
	}
	return d, spent
}
