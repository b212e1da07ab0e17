package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/quality"
	"github.com/regen-dev/regen/internal/store"
)

// chatFunc is a Chatter made of a function.
type chatFunc func(ctx context.Context, req llm.Request, onDelta func(int)) (llm.Result, error)

func (f chatFunc) Chat(ctx context.Context, req llm.Request, onDelta func(int)) (llm.Result, error) {
	return f(ctx, req, onDelta)
}

// sent is one request as a turn-aware fake server saw it.
type sent struct {
	sample    string // the first user message
	turn      int    // assistant messages in the history
	maxTokens int
	messages  []map[string]any
}

// turnServer answers every request after a second, counts requests per
// (sample, turn) and lets answer decide the result.
type turnServer struct {
	mu     sync.Mutex
	log    []sent
	answer func(s sent) (llm.Result, error)
}

func (ts *turnServer) chatter() Chatter {
	return chatFunc(func(ctx context.Context, req llm.Request, onDelta func(int)) (llm.Result, error) {
		var body struct {
			Messages []map[string]any `json:"messages"`
		}
		if err := json.Unmarshal(requestBody(req), &body); err != nil {
			return llm.Result{}, &llm.Error{Class: llm.Malformed, Msg: err.Error()}
		}
		s := sent{maxTokens: req.MaxTokens, messages: body.Messages}
		for _, m := range body.Messages {
			switch m["role"] {
			case "assistant":
				s.turn++
			case "user":
				if s.sample == "" {
					s.sample, _ = m["content"].(string)
				}
			}
		}
		ts.mu.Lock()
		ts.log = append(ts.log, s)
		ts.mu.Unlock()
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return llm.Result{}, &llm.Error{Class: llm.ServerDown, Msg: "cancelled", Err: ctx.Err()}
		case <-t.C:
		}
		res, err := ts.answer(s)
		if err != nil {
			return res, err // an error answer streams nothing
		}
		onDelta(1)
		res.Usage.PromptTokens, res.Usage.CompletionTokens = 10*(s.turn+1), 5
		return res, nil
	})
}

func (ts *turnServer) perTurn() map[string]int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	m := map[string]int{}
	for _, s := range ts.log {
		m[fmt.Sprintf("%s/%d", s.sample, s.turn)]++
	}
	return m
}

// addBodies ingests samples with the given bodies into lane.
func addBodies(st *fakeStore, lane string, bodies map[string]string) {
	var ns []store.NewSample
	for id, b := range bodies {
		ns = append(ns, store.NewSample{ID: id, Partition: "p", Lane: lane, Body: []byte(b)})
	}
	if _, err := st.Ingest(context.Background(), ns); err != nil {
		panic(err)
	}
}

// chat3 is a three-turn conversation whose first user message is id.
func chat3(id string) string {
	return `{"messages":[{"role":"user","content":"` + id + `"}],"turns":[{"input":[{"role":"user","content":"` + id + ` q1"}]},{"input":[{"role":"user","content":"` + id + ` q2"}]}]}`
}

func TestMultiTurnEachTurnOnceInOrder(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep reasoning %v", keep), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := newFakeStore()
				addBodies(st, "short", map[string]string{"a": chat3("a"), "b": chat3("b")})
				ts := &turnServer{answer: func(s sent) (llm.Result, error) {
					return llm.Result{Content: fmt.Sprintf("%s answer %d", s.sample, s.turn), ReasoningContent: "thought", FinishReason: "stop"}, nil
				}}
				cfg := baseConfig(st, []Endpoint{{URL: "http://a", Client: ts.chatter()}})
				cfg.KeepReasoning = keep
				cfg.Quality = quality.Default()
				d := mustNew(t, cfg)
				if err := d.Run(t.Context()); err != nil {
					t.Fatalf("Run: %v", err)
				}
				want := map[string]int{"a/0": 1, "a/1": 1, "a/2": 1, "b/0": 1, "b/1": 1, "b/2": 1}
				if diff := cmp.Diff(want, ts.perTurn()); diff != "" {
					t.Errorf("requests per sample/turn (-want +got):\n%s", diff)
				}
				for _, s := range ts.log {
					if s.turn != 2 {
						continue
					}
					// The history holds the model's own earlier answers.
					if got := s.messages[1]["content"]; got != s.sample+" answer 0" {
						t.Errorf("%s turn 2 history answer 0 = %v", s.sample, got)
					}
					if _, has := s.messages[3]["reasoning_content"]; has != keep {
						t.Errorf("%s turn 2: reasoning_content in history = %v, want %v", s.sample, has, keep)
					}
				}
				a := st.get("a")
				if a.state != store.Done || a.result.Turn != 2 || len(a.prior) != 2 || a.attempts != 1 {
					t.Errorf("a = %s turn %d, %d prior, %d attempts; want done at turn 2 with 2 prior turns, 1 attempt", a.state, a.result.Turn, len(a.prior), a.attempts)
				}
				if diff := cmp.Diff(Counters{Done: 2, Turns: 4}, d.Snapshot().Counters); diff != "" {
					t.Errorf("counters (-want +got):\n%s", diff)
				}
			})
		})
	}
}

func TestTruncatedTurnEscalatesThatTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		addBodies(st, "short", map[string]string{"a": chat3("a")})
		ts := &turnServer{answer: func(s sent) (llm.Result, error) {
			if s.turn == 1 && s.maxTokens == 100 {
				return llm.Result{Content: "cut", FinishReason: "length"}, nil
			}
			return llm.Result{Content: "ok", FinishReason: "stop"}, nil
		}}
		cfg := baseConfig(st, []Endpoint{{URL: "http://a", Client: ts.chatter()}})
		cfg.Lanes = []LaneConfig{{Name: "short", Concurrency: 2, MaxTokens: 100, EscalateTo: "long"}, {Name: "long", Concurrency: 2, MaxTokens: 1000}}
		cfg.Quality = quality.Default()
		var asked []int
		cfg.LaneFor = func(partition string, promptTokens int) string {
			asked = append(asked, promptTokens)
			return "short"
		}
		d := mustNew(t, cfg)
		if err := d.Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		var lanes []string
		for _, s := range ts.log {
			lanes = append(lanes, fmt.Sprintf("turn %d max %d", s.turn, s.maxTokens))
		}
		want := []string{"turn 0 max 100", "turn 1 max 100", "turn 1 max 1000", "turn 2 max 100"}
		if diff := cmp.Diff(want, lanes); diff != "" {
			t.Errorf("requests (-want +got):\n%s", diff)
		}
		a := st.get("a")
		if a.state != store.Done || a.prior[1].Lane != "long" || a.prior[0].Lane != "short" || a.Lane != "short" {
			t.Errorf("a: %s, turn lanes %s %s, final lane %s; want done, turn 1 in long, back in short after", a.state, a.prior[0].Lane, a.prior[1].Lane, a.Lane)
		}
		// The next prompt is estimated from the answered prompt, the answer and the next input.
		if len(asked) != 2 || asked[0] != 10+5+len(`"a q1"`)/4+8 {
			t.Errorf("LaneFor asked with %v, want two calls, the first with 24 tokens", asked)
		}
	})
}

// toolBody records a call to book(room=A) answered by a tool result, then a user turn.
const toolBody = `{"messages":[{"role":"user","content":"%s"}],"tools":[{"type":"function","function":{"name":"book"}}],` +
	`"turns":[{"calls":[{"id":"call_1","type":"function","function":{"name":"book","arguments":"{\"room\":\"A\"}"}}],` +
	`"input":[{"role":"tool","content":"booked","tool_call_id":"call_1"}]},{"input":[{"role":"user","content":"thanks"}]}]}`

func TestToolTurns(t *testing.T) {
	call := func(args string) llm.Result {
		var c llm.ToolCall
		c.ID, c.Type = "srv-1", "function"
		c.Function.Name, c.Function.Arguments = "book", args
		return llm.Result{ToolCalls: []llm.ToolCall{c}, FinishReason: "tool_calls"}
	}
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		addBodies(st, "short", map[string]string{
			"match": fmt.Sprintf(toolBody, "match"), "other": fmt.Sprintf(toolBody, "other"), "text": fmt.Sprintf(toolBody, "text")})
		ts := &turnServer{answer: func(s sent) (llm.Result, error) {
			switch {
			case s.turn > 0:
				return llm.Result{Content: "fine", FinishReason: "stop"}, nil
			case s.sample == "match":
				return call(`{ "room": "A" }`), nil
			case s.sample == "other":
				return call(`{"room":"B"}`), nil
			}
			return llm.Result{Content: "Which room?", FinishReason: "stop"}, nil
		}}
		cfg := baseConfig(st, []Endpoint{{URL: "http://a", Client: ts.chatter()}})
		cfg.Quality = quality.Default()
		d := mustNew(t, cfg)
		if err := d.Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		want := map[string]int{"match/0": 1, "match/1": 1, "match/2": 1, "other/0": 1, "text/0": 1}
		if diff := cmp.Diff(want, ts.perTurn()); diff != "" {
			t.Errorf("requests per sample/turn (-want +got):\n%s", diff)
		}
		for _, s := range ts.log {
			if s.sample == "match" && s.turn == 1 {
				if id := s.messages[2]["tool_call_id"]; id != "srv-1" {
					t.Errorf("turn 1 tool result answers %v, want the model's call srv-1", id)
				}
			}
		}
		for id, why := range map[string]string{"match": "", "other": `arguments {"room":"B"}, the dataset's {"room":"A"}`, "text": "answered without a tool call"} {
			x := st.get(id)
			if x.state != store.Done || !strings.Contains(x.result.EndReason, why) || (why == "") != (x.result.EndReason == "") {
				t.Errorf("%s: %s, end reason %q; want done, end reason containing %q", id, x.state, x.result.EndReason, why)
			}
		}
		if diff := cmp.Diff(Counters{Done: 3, Turns: 2, Ended: 2}, d.Snapshot().Counters); diff != "" {
			t.Errorf("counters (-want +got):\n%s", diff)
		}
	})
}

func TestQualityRejects(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		addBodies(st, "short", map[string]string{"ok": chat3("ok"), "think": chat3("think"), "undeclared": fmt.Sprintf(toolBody, "undeclared")})
		ts := &turnServer{answer: func(s sent) (llm.Result, error) {
			switch {
			case s.sample == "think" && s.turn == 1:
				return llm.Result{Content: "<think>hmm</think>answer", FinishReason: "stop"}, nil
			case s.sample == "undeclared":
				var c llm.ToolCall
				c.Function.Name, c.Function.Arguments = "delete_everything", "{}"
				return llm.Result{ToolCalls: []llm.ToolCall{c}, FinishReason: "tool_calls"}, nil
			}
			return llm.Result{Content: "fine", FinishReason: "stop"}, nil
		}}
		cfg := baseConfig(st, []Endpoint{{URL: "http://a", Client: ts.chatter()}})
		cfg.Quality = quality.Default()
		d := mustNew(t, cfg)
		if err := d.Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		think := st.get("think")
		if think.state != store.Rejected || think.rule != quality.RuleThinkTags || think.result.Turn != 1 || len(think.prior) != 1 ||
			!strings.Contains(think.reason, "content holds <think>") {
			t.Errorf("think = %s rule %q at turn %d (%d prior): %q; want rejected by think_tags at turn 1", think.state, think.rule, think.result.Turn, len(think.prior), think.reason)
		}
		if u := st.get("undeclared"); u.state != store.Rejected || u.rule != quality.RuleToolName {
			t.Errorf("undeclared = %s rule %q, want rejected by tool_name", u.state, u.rule)
		}
		if ok := st.get("ok"); ok.state != store.Done {
			t.Errorf("ok = %s, want done", ok.state)
		}
		if diff := cmp.Diff(Counters{Done: 1, Turns: 3, Rejected: 2}, d.Snapshot().Counters); diff != "" {
			t.Errorf("counters (-want +got):\n%s", diff)
		}
	})
}

func TestPoisonGuard(t *testing.T) {
	refuse := func(msg string) func(s sent) (llm.Result, error) {
		return func(s sent) (llm.Result, error) {
			return llm.Result{}, &llm.Error{Class: llm.BadRequest, Status: 400, Msg: msg}
		}
	}
	t.Run("identical 400s stop dispatch and requeue", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := newFakeStore()
			st.add("short", "s", 200)
			ts := &turnServer{answer: refuse(`Unsupported parameter: 'top_k'`)}
			cfg := baseConfig(st, []Endpoint{{URL: "http://a", Client: ts.chatter()}})
			cfg.Lanes[0].Concurrency = 150
			cfg.PoisonAfter = 10
			cfg.Params = map[string]json.RawMessage{"top_k": json.RawMessage("20"), "temperature": json.RawMessage("0.7")}
			d := mustNew(t, cfg)
			err := d.Run(t.Context())
			var pe *PoisonError
			if !errors.As(err, &pe) {
				t.Fatalf("Run = %v, want a PoisonError", err)
			}
			if len(ts.log) != 10 {
				t.Errorf("requests sent = %d, want exactly 10", len(ts.log))
			}
			if pe.Requeued != 10 || !pe.RequeueOK || !cmp.Equal(pe.Params, []string{"top_k"}) {
				t.Errorf("PoisonError = %+v, want 10 requeued, params [top_k]", pe)
			}
			for _, s := range []string{`Unsupported parameter: 'top_k'`, `the error names "top_k"`, "10 different samples", "back to pending"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
			if diff := cmp.Diff(map[store.State]int{store.Pending: 200}, st.states()); diff != "" {
				t.Errorf("states after the stop (-want +got):\n%s", diff)
			}
		})
	})
	t.Run("different 400s are the samples' own", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := newFakeStore()
			st.add("short", "s", 30)
			ts := &turnServer{answer: func(s sent) (llm.Result, error) {
				return llm.Result{}, &llm.Error{Class: llm.BadRequest, Status: 400, Msg: "prompt of " + s.sample + " is too long"}
			}}
			cfg := baseConfig(st, []Endpoint{{URL: "http://a", Client: ts.chatter()}})
			cfg.Lanes[0].Concurrency = 20
			cfg.PoisonAfter = 10
			d := mustNew(t, cfg)
			if err := d.Run(t.Context()); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if diff := cmp.Diff(map[store.State]int{store.Dead: 30}, st.states()); diff != "" {
				t.Errorf("states (-want +got):\n%s", diff)
			}
		})
	})
	t.Run("after an accepted request 400s are dead letters", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := newFakeStore()
			st.add("short", "s", 40)
			var mu sync.Mutex
			n := 0
			ts := &turnServer{answer: func(s sent) (llm.Result, error) {
				mu.Lock()
				defer mu.Unlock()
				n++
				if n == 1 {
					return llm.Result{Content: "fine", FinishReason: "stop"}, nil
				}
				return llm.Result{}, &llm.Error{Class: llm.BadRequest, Status: 400, Msg: "same"}
			}}
			cfg := baseConfig(st, []Endpoint{{URL: "http://a", Client: ts.chatter()}})
			cfg.Lanes[0].Concurrency = 1
			cfg.PoisonAfter = 5
			d := mustNew(t, cfg)
			if err := d.Run(t.Context()); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if diff := cmp.Diff(map[store.State]int{store.Done: 1, store.Dead: 39}, st.states()); diff != "" {
				t.Errorf("states (-want +got):\n%s", diff)
			}
		})
	})
}

func TestUnbuildableSampleIsDeadLettered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		addBodies(st, "short", map[string]string{"bad": `{"messages":[]}`, "good": chat3("good")})
		ts := &turnServer{answer: func(s sent) (llm.Result, error) { return llm.Result{Content: "x", FinishReason: "stop"}, nil }}
		d := mustNew(t, baseConfig(st, []Endpoint{{URL: "http://a", Client: ts.chatter()}}))
		if err := d.Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if b := st.get("bad"); b.state != store.Dead || !strings.Contains(b.reason, "build request: decode sample body: no messages") {
			t.Errorf("bad = %s %q, want dead naming the body problem", b.state, b.reason)
		}
		if g := st.get("good"); g.state != store.Done {
			t.Errorf("good = %s, want done", g.state)
		}
		// Nothing was sent for it, so the endpoint has no error to count.
		if errs := d.Snapshot().Endpoints[0].Errors; len(errs) != 0 {
			t.Errorf("endpoint errors = %v, want none", errs)
		}
	})
}
