package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/probe"
	"github.com/regen-dev/regen/internal/quality"
	"github.com/regen-dev/regen/internal/store"
)

// TestSlotContext runs the simulator's llama.cpp mode (2 slots of 512
// tokens) with answers that would run past the slot. Once the probe has
// read the slot's context, an answer the slot cut is rejected in its lane
// with the context as the cause, not escalated (one request per sample),
// and a prompt far over every endpoint's context is dead-lettered without
// a request. Without the context, the same job escalates every answer to
// the long lane, where it is cut again.
func TestSlotContext(t *testing.T) {
	for _, known := range []bool{true, false} {
		t.Run(map[bool]string{true: "context read", false: "context unknown"}[known], func(t *testing.T) {
			cfg := fastSim()
			cfg.Engine, cfg.Slots, cfg.ContextLen = "llamacpp", 2, 1024
			cfg.OutputMean, cfg.OutputSigma, cfg.TruncateFraction = 5000, 0, 0
			ep, arrivals := simServer(t, cfg)
			st := newFakeStore()
			st.add("short", "c", 4)
			long := strings.Repeat("word ", 600) // 3,000 bytes: about 750 tokens
			if _, err := st.Ingest(context.Background(), []store.NewSample{{ID: "huge", Partition: "p", Lane: "short",
				PromptTokens: 750, Body: []byte(`{"messages":[{"role":"user","content":"` + long + `"}]}`)}}); err != nil {
				t.Fatal(err)
			}
			c := baseConfig(st, []Endpoint{ep})
			c.Lanes = []LaneConfig{
				{Name: "short", Concurrency: 2, MaxTokens: 2000, EscalateTo: "long"},
				{Name: "long", Concurrency: 2, MaxTokens: 8000},
			}
			c.Quality = quality.Rules{Truncated: true}
			var logs logLines
			c.Logger = logs.logger()
			d := mustNew(t, c)
			if known {
				d.observeProbe(t, ep.URL)
			}
			if err := d.Run(t.Context()); err != nil {
				t.Fatalf("Run: %v", err)
			}
			sent := map[string]int{}
			for _, a := range arrivals() {
				sent[a.id]++
			}
			for i := range 4 {
				id := sampleID("c", i)
				s := st.get(id)
				if s.state != store.Rejected || s.rule != quality.RuleTruncated {
					t.Fatalf("%s: %s (%s), want rejected as truncated", id, s.state, s.rule)
				}
				cause := strings.Contains(s.reason, "cut by the server's context: prompt") && strings.Contains(s.reason, "fill its 512-token context")
				if known && (!cause || sent[id] != 1) {
					t.Errorf("%s: %d requests, reason %q; want 1 request and the slot's context as the cause", id, sent[id], s.reason)
				}
				if !known && (cause || sent[id] != 2) {
					t.Errorf("%s: %d requests, reason %q; want the escalation (2 requests) of a job that does not know the context", id, sent[id], s.reason)
				}
			}
			huge := st.get("huge")
			if known && (huge.state != store.Dead || sent[long] != 0 || !strings.Contains(huge.reason, "exceeds the 512-token context of every endpoint")) {
				t.Errorf("huge: %s after %d requests, reason %q; want dead, unsent, naming the context", huge.state, sent[long], huge.reason)
			}
			if !known && (huge.state != store.Dead || sent[long] != 1 || !strings.Contains(huge.reason, "exceeds the available context size (512 tokens)")) {
				t.Errorf("huge: %s after %d requests, reason %q; want dead after the server's refusal", huge.state, sent[long], huge.reason)
			}
			// The dead letter reaches the log, sent or not.
			if got := logs.with("sample dead-lettered", "sample=huge", fmt.Sprintf("sent=%t", !known)); len(got) != 1 {
				t.Errorf("huge: %d dead-letter log lines (sent=%t), want 1", len(got), !known)
			}
		})
	}
}

// observeProbe feeds d one probe of the server at url, as the runner's
// scrape loop does.
func (d *Dispatcher) observeProbe(t *testing.T, url string) {
	t.Helper()
	dl, err := engine.Lookup(engine.LlamaCpp)
	if err != nil {
		t.Fatal(err)
	}
	m, err := probe.Metrics(context.Background(), nil, url, dl)
	if err != nil || m.Context != 512 || m.Slots != 2 {
		t.Fatalf("probe: context %v slots %v err %v; want 512 and 2", m.Context, m.Slots, err)
	}
	d.Observe(url, m, time.Now())
}

// countingChatter is a client whose server counts every prompt as n
// tokens at its tokenizer route, and records the bodies it was asked to count.
type countingChatter struct {
	fakeChatter
	n      int
	counts []string
}

func (c *countingChatter) CountTokens(ctx context.Context, path string, chat bool, model string, body json.RawMessage) (int, error) {
	c.counts = append(c.counts, fmt.Sprintf("%s chat=%v %s", path, chat, model))
	return c.n, nil
}

// TestTooLongTokenizer: against a 1,000-token context, a first prompt is
// refused on its estimate when that is past 1.25x the context, sent
// uncounted when its body is under the context in bytes, and otherwise
// counted by the engine's tokenizer, refused when the count reaches the
// context. Later turns and engines without a tokenizer are not counted.
func TestTooLongTokenizer(t *testing.T) {
	body := func(n int) []byte {
		return []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("7", n) + `"}]}`)
	}
	for _, tc := range []struct {
		name      string
		estimate  int
		body      []byte
		turn      int
		counted   int // the tokenizer's count
		tokenizer engine.Tokenizer
		want      string // part of the reason; "" when it may be sent
		asked     bool
	}{
		{"estimate past 1.25x the context", 1300, body(5200), 0, 5200, engine.Tokenizer{Path: "/tokenize"}, "prompt of about 1300 tokens exceeds the 1000-token context", false},
		{"body under the context in bytes", 200, body(800), 0, 5000, engine.Tokenizer{Path: "/tokenize"}, "", false},
		{"digits near the limit, counted past it", 300, body(1200), 0, 1200, engine.Tokenizer{Path: "/tokenize"}, "prompt of 1200 tokens (counted by llamacpp's POST /tokenize) does not fit the 1000-token context", true},
		{"near the limit, counted under it", 300, body(1200), 0, 999, engine.Tokenizer{Path: "/tokenize", Chat: true}, "", true},
		{"a later turn", 300, body(1200), 1, 1200, engine.Tokenizer{Path: "/tokenize"}, "", false},
		{"no tokenizer", 300, body(1200), 0, 1200, engine.Tokenizer{}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := &countingChatter{fakeChatter: fakeChatter{url: "http://a", tr: newTracker()}, n: tc.counted}
			d := mustNew(t, baseConfig(newFakeStore(), []Endpoint{{URL: "http://a", Client: cl}}))
			d.SetServer("http://a", Server{Engine: "llamacpp", Tokenizer: tc.tokenizer})
			d.Observe("http://a", engine.Metrics{Context: 1000, Present: engine.FieldContext}, time.Now())
			got := d.tooLong(t.Context(), d.epByURL["http://a"], store.Claimed{ID: "s", PromptTokens: tc.estimate, Turn: tc.turn}, &turn{index: tc.turn, body: tc.body})
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("tooLong = %q, want %q", got, tc.want)
			}
			if asked := len(cl.counts) > 0; asked != tc.asked {
				t.Errorf("tokenizer asked %v (%v), want %v", asked, cl.counts, tc.asked)
			} else if asked && cl.counts[0] != fmt.Sprintf("/tokenize chat=%v m", tc.tokenizer.Chat) {
				t.Errorf("tokenizer asked %q", cl.counts[0])
			}
		})
	}
}
