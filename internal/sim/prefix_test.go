package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPrefixCacheRules(t *testing.T) {
	seg := func(hs ...uint64) []prefixSeg {
		var out []prefixSeg
		for i, h := range hs {
			out = append(out, prefixSeg{h, 100 * (i + 1)})
		}
		return out
	}
	type op struct {
		kind  string // insert, lock, unlock, evict, match
		segs  []prefixSeg
		need  int
		want  int // match: hit tokens; evict: freed
		used  int
		evict int
	}
	tests := []struct {
		name string
		ops  []op
	}{
		{"a shared prefix is held once", []op{
			{kind: "insert", segs: seg(1, 2), used: 200, evict: 200},
			{kind: "insert", segs: seg(1, 3), used: 300, evict: 300},
			{kind: "match", segs: seg(1, 3, 4), want: 200, used: 300, evict: 300},
		}},
		{"locked nodes are not evicted", []op{
			{kind: "insert", segs: seg(1, 2), used: 200, evict: 200},
			{kind: "lock", segs: seg(1, 2), used: 200, evict: 0},
			{kind: "evict", need: 1000, want: 0, used: 200, evict: 0},
			{kind: "unlock", segs: seg(1, 2), used: 200, evict: 200},
			{kind: "evict", need: 1000, want: 200, used: 0, evict: 0},
		}},
		{"least recently used leaf first, parent after its children", []op{
			{kind: "insert", segs: seg(1, 2), used: 200, evict: 200},
			{kind: "insert", segs: seg(5, 6), used: 400, evict: 400},
			{kind: "match", segs: seg(1, 2), want: 200, used: 400, evict: 400},
			{kind: "evict", need: 100, want: 100, used: 300, evict: 300},
			{kind: "match", segs: seg(5, 6), want: 100, used: 300, evict: 300},
			{kind: "match", segs: seg(1, 2), want: 200, used: 300, evict: 300},
			{kind: "evict", need: 150, want: 200, used: 100, evict: 100},
			{kind: "match", segs: seg(1, 2), want: 100, used: 100, evict: 100},
		}},
		{"a held child keeps its parent", []op{
			{kind: "insert", segs: seg(1, 2), used: 200, evict: 200},
			{kind: "insert", segs: seg(1, 3), used: 300, evict: 300},
			{kind: "lock", segs: seg(1, 3), used: 300, evict: 100},
			{kind: "evict", need: 1000, want: 100, used: 200, evict: 0},
			{kind: "match", segs: seg(1, 3), want: 200, used: 200, evict: 0},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newPrefixCache()
			for i, o := range tc.ops {
				got := 0
				switch o.kind {
				case "insert":
					c.insert(o.segs)
				case "lock":
					n, _ := c.match(o.segs)
					c.lock(n)
				case "unlock":
					n, _ := c.match(o.segs)
					c.unlock(n)
				case "evict":
					got = c.evict(o.need)
				case "match":
					_, got = c.match(o.segs)
				}
				if got != o.want || c.used != o.used || c.evictable != o.evict {
					t.Errorf("op %d %s: got %d, used %d, evictable %d; want %d, %d, %d",
						i, o.kind, got, c.used, c.evictable, o.want, o.used, o.evict)
				}
			}
		})
	}
}

// schedFor builds a scheduler of its own on s (not the one s runs), driven
// by the test step by step.
func schedFor(t *testing.T, c Config) (*Server, *scheduler) {
	t.Helper()
	s, err := New(c, io.Discard)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	sc := newScheduler(s)
	sc.timer = time.NewTimer(time.Hour)
	sc.timer.Stop()
	sc.realStart = time.Now()
	return s, sc
}

func chatReq(t *testing.T, s *Server, system, user string, maxTokens int) *request {
	t.Helper()
	body := fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"max_tokens":%d}`, system, user, maxTokens)
	var in genRequest
	if err := json.Unmarshal([]byte(body), &in); err != nil {
		t.Fatal(err)
	}
	r, _, _, msg := s.buildRequest(&in, kindChat)
	if msg != "" {
		t.Fatal(msg)
	}
	r.plan.target = maxTokens // run until max_tokens: the test decides when it ends
	return r
}

// TestSharedPrefixInPool checks the pool's accounting: a prompt prefix
// shared by running requests is held once, a later request with the same
// prefix is charged (and reports cached) only the rest, and under pressure
// unheld prefixes are evicted least recently used first.
func TestSharedPrefixInPool(t *testing.T) {
	c := testConfig()
	c.KVTokens = 6000
	s, sc := schedFor(t, c)
	ctx := context.Background()
	system := strings.Repeat("tool schema ", 700) // ~2100 tokens at 4 bytes a token
	var reqs []*request
	for i := range 3 {
		reqs = append(reqs, chatReq(t, s, system, fmt.Sprintf("question %d", i), 50))
	}
	prompt := reqs[0].prompt
	// Alone, three such prompts would not fit in the pool.
	for _, r := range reqs {
		sc.waiting = append(sc.waiting, r)
		if b := sc.admit(); len(b) != 1 || !sc.prefill(ctx, b) {
			t.Fatalf("request sharing the prefix not admitted beside %d others", len(sc.running))
		}
	}
	if got, alone := sc.inUse(), 3*(prompt+1); got >= alone/2 {
		t.Errorf("3 requests sharing a %d-token prefix hold %d tokens; want under half of %d", prompt, got, alone)
	}
	late := chatReq(t, s, system, "question 3", 50)
	sc.waiting = append(sc.waiting, late)
	if b := sc.admit(); len(b) != 1 || !sc.prefill(ctx, b) {
		t.Fatal("the fourth request sharing the prefix was not admitted")
	}
	if late.cached < prompt-20 || late.cached >= prompt {
		t.Errorf("cached tokens %d of a %d-token prompt; want all but the last message", late.cached, prompt)
	}
	for _, r := range sc.running {
		sc.finish(r, "stop")
	}
	sc.running = nil
	if sc.inUse() != 0 || sc.cache.evictable == 0 {
		t.Fatalf("after every request ended: in use %d, evictable %d; want 0 and the prefix kept", sc.inUse(), sc.cache.evictable)
	}
	// Two other long prompts need the room: the shared prefix, oldest, goes.
	for i := range 2 {
		other := chatReq(t, s, strings.Repeat(fmt.Sprintf("other %d ", i), 1000), "q", 10)
		sc.waiting = append(sc.waiting, other)
		if b := sc.admit(); len(b) != 1 || !sc.prefill(ctx, b) {
			t.Fatalf("other prompt %d not admitted", i)
		}
		sc.finish(other, "stop")
		sc.running = nil
	}
	if sc.used > sc.pool {
		t.Errorf("pool holds %d tokens, more than its %d", sc.used, sc.pool)
	}
	again := chatReq(t, s, system, "question 0", 50)
	sc.waiting = append(sc.waiting, again)
	if b := sc.admit(); len(b) != 1 || !sc.prefill(ctx, b) {
		t.Fatal("the first prompt again was not admitted")
	}
	if again.cached != 0 {
		t.Errorf("evicted prefix still hit %d tokens; want 0", again.cached)
	}
}

// TestCacheMetrics checks the hit counters both engines export and the
// usage's cached_tokens over HTTP.
func TestCacheMetrics(t *testing.T) {
	for _, engine := range []string{"sglang", "vllm"} {
		t.Run(engine, func(t *testing.T) {
			c := testConfig()
			c.Engine = engine
			_, url, _ := startServer(t, c)
			system := strings.Repeat("shared tools ", 400)
			body := func(q string) string {
				return fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`, system, q)
			}
			a := streamChat(http.DefaultClient, url, body("first"))
			b := streamChat(http.DefaultClient, url, body("second"))
			if a.err != nil || b.err != nil {
				t.Fatalf("requests: %v, %v", a.err, b.err)
			}
			if a.usage.PromptTokensDetails.CachedTokens != 0 || b.usage.PromptTokensDetails.CachedTokens < b.usage.PromptTokens*9/10 {
				t.Errorf("cached_tokens %d then %d of %d; want 0, then the shared prefix",
					a.usage.PromptTokensDetails.CachedTokens, b.usage.PromptTokensDetails.CachedTokens, b.usage.PromptTokens)
			}
			m := scrape(t, url)
			hits, queries := m["sglang:cached_tokens_total"], m["sglang:prompt_tokens_total"]
			if engine == "vllm" {
				hits, queries = m["vllm:prefix_cache_hits_total"], m["vllm:prefix_cache_queries_total"]
			}
			want := float64(b.usage.PromptTokensDetails.CachedTokens)
			if hits != want || queries != float64(a.usage.PromptTokens+b.usage.PromptTokens) {
				t.Errorf("hits %v of %v queried; want %v of %d", hits, queries, want, a.usage.PromptTokens+b.usage.PromptTokens)
			}
			if engine == "sglang" && m["sglang:cache_hit_rate"] <= 0.9 {
				t.Errorf("cache_hit_rate %v after the second prefill; want above 0.9", m["sglang:cache_hit_rate"])
			}
		})
	}
}

// A conversation's next turn finds its previous answer cached, as SGLang
// and vLLM keep a finished request's output: its whole prompt but the new
// question is a hit; with CacheAnswers off only the turns before the
// answer are.
func TestNextTurnFindsItsAnswerCached(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprint("cache answers ", on), func(t *testing.T) {
			c := testConfig()
			c.CacheAnswers = on
			c.OutputMean, c.OutputSigma = 200, 0.01
			_, url, _ := startServer(t, c)
			system := strings.Repeat("shared tools ", 400)
			first := fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":"first"}],"max_tokens":300,"stream":true,"stream_options":{"include_usage":true}}`, system)
			a := streamChat(http.DefaultClient, url, first)
			if a.err != nil || a.content == "" {
				t.Fatalf("first turn: %v, content %q", a.err, a.content)
			}
			answer, _ := json.Marshal(a.content)
			next := fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":"first"},{"role":"assistant","content":%s},{"role":"user","content":"second"}],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`, system, answer)
			b := streamChat(http.DefaultClient, url, next)
			if b.err != nil {
				t.Fatal(b.err)
			}
			cached, prompt := b.usage.PromptTokensDetails.CachedTokens, b.usage.PromptTokens
			answerTokens := len(answer) / 4
			if on && cached < prompt-10 {
				t.Errorf("cached %d of %d prompt tokens; want all but the new question's", cached, prompt)
			}
			if !on && cached > prompt-answerTokens {
				t.Errorf("cached %d of %d prompt tokens with answers not cached; want at most %d (not the %d-token answer)", cached, prompt, prompt-answerTokens, answerTokens)
			}
		})
	}
}

// TestMissLogNamesTheCause: with miss_log set, each later turn writes a
// line naming why it found less than its previous prompt and answer
// cached: nothing missing when the answer is sent back as given, the key
// when it is sent back changed, eviction once another conversation
// needed the pool.
func TestMissLogNamesTheCause(t *testing.T) {
	c := testConfig()
	c.KVTokens = 3000
	c.OutputMean, c.OutputSigma = 60, 0.01
	c.MissLog = filepath.Join(t.TempDir(), "miss.jsonl")
	s, url, _ := startServer(t, c)
	chat := func(msgs string) streamResult {
		t.Helper()
		res := streamChat(http.DefaultClient, url, `{"model":"m","messages":[`+msgs+`],"max_tokens":80,"stream":true,"stream_options":{"include_usage":true}}`)
		if res.err != nil || res.status != 200 {
			t.Fatalf("chat: status %d, %v", res.status, res.err)
		}
		return res
	}
	system := fmt.Sprintf(`{"role":"system","content":%q}`, strings.Repeat("a long system prompt ", 200))
	head := system + `,{"role":"user","content":"first"}`
	a := chat(head)
	answer, _ := json.Marshal(a.content)
	chat(head + `,{"role":"assistant","content":` + string(answer) + `},{"role":"user","content":"second"}`)
	changed, _ := json.Marshal(a.content + " ")
	chat(head + `,{"role":"assistant","content":` + string(changed) + `},{"role":"user","content":"second"}`)
	// Another conversation whose system prompt needs most of the pool.
	chat(fmt.Sprintf(`{"role":"system","content":%q},{"role":"user","content":"other"}`, strings.Repeat("another system prompt ", 500)))
	chat(head + `,{"role":"assistant","content":` + string(answer) + `},{"role":"user","content":"third"}`)
	s.Close()

	data, err := os.ReadFile(c.MissLog)
	if err != nil {
		t.Fatal(err)
	}
	var got []missRecord
	timeline := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var r missRecord
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if r.Cause == "first" || r.Cause == "done" {
			timeline[r.Cause]++
			continue
		}
		got = append(got, r)
	}
	if timeline["first"] != 2 || timeline["done"] != 5 {
		t.Errorf("timeline lines: %v, want 2 first turns and 5 done", timeline)
	}
	want := []string{"none", "answer_key", "prompt_evicted"}
	if len(got) != len(want) {
		t.Fatalf("got %d lines, want %d (later turns only): %s", len(got), len(want), data)
	}
	for i, r := range got {
		if r.Cause != want[i] {
			t.Errorf("later turn %d: cause %q, want %q (%+v)", i, r.Cause, want[i], r)
		}
	}
	if r := got[0]; r.Hit != r.Expected || r.Expected <= r.PrevPrompt {
		t.Errorf("answer sent back as given: hit %d, want the previous prompt %d and its answer, %d", r.Hit, r.PrevPrompt, r.Expected)
	}
	if r := got[1]; r.Hit != r.PrevPrompt || r.SentAnswer == r.CachedAnswer {
		t.Errorf("changed answer: hit %d (want the previous prompt, %d), sent %s against cached %s", r.Hit, r.PrevPrompt, r.SentAnswer, r.CachedAnswer)
	}
	if r := got[2]; r.EvictedAt < 0 || r.Pool == nil || r.Hit != 0 {
		t.Errorf("evicted history: hit %d, evicted at %v, pool %+v; want hit 0 and the eviction's pool", r.Hit, r.EvictedAt, r.Pool)
	}
}
