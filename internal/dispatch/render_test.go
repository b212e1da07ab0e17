package dispatch

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/reply"
	"github.com/regen-dev/regen/internal/store"
)

// renderingChatter is a client whose server renders every request as ids.
type renderingChatter struct {
	fakeChatter
	ids   []int32
	err   error
	paths []string
}

// renderingClient gives any Chatter a render route that answers ids.
type renderingClient struct {
	Chatter
	ids []int32
	err error
}

func (c *renderingClient) RenderChat(ctx context.Context, path string, req llm.Request) ([]int32, error) {
	return c.ids, c.err
}

func (c *renderingChatter) RenderChat(ctx context.Context, path string, req llm.Request) ([]int32, error) {
	c.paths = append(c.paths, path+" "+req.Model)
	return c.ids, c.err
}

// TestCheckRender: an answer whose prompt ids equal the server's render
// keeps them; one that differs is marked unavailable at the first
// differing index (an id, or where one is shorter); a render that fails
// marks them unavailable with its error (they were not checked); without a
// render route nothing is asked.
func TestCheckRender(t *testing.T) {
	const route = "/v1/chat/completions/render"
	for _, tc := range []struct {
		name     string
		route    string
		rendered []int32
		want     string // part of TokenIDsUnavailable; "" when kept
		asked    bool
		err      error
	}{
		{"equal", route, []int32{1, 2, 3, 4}, "", true, nil},
		{"one id off", route, []int32{1, 2, 9, 4}, "turn 2's prompt ids differ from the server's render of its messages (POST /v1/chat/completions/render) at index 2: id 3 returned, 9 rendered", true, nil},
		{"render longer", route, []int32{1, 2, 3, 4, 5}, "at index 4: 4 ids returned, 5 rendered", true, nil},
		{"no render route", "", []int32{9}, "", false, nil},
		{"render fails", route, nil, "render check failed: turn 2's prompt ids could not be compared with the server's render of its messages (POST /v1/chat/completions/render): render: 503 loading", true,
			errors.New("render: 503 loading")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := &renderingChatter{fakeChatter: fakeChatter{url: "http://a", tr: newTracker()}, ids: tc.rendered, err: tc.err}
			d := mustNew(t, baseConfig(newFakeStore(), []Endpoint{{URL: "http://a", Client: cl}}))
			d.SetServer("http://a", Server{Engine: "vllm", Render: tc.route})
			res := llm.Result{PromptTokenIDs: []int32{1, 2, 3, 4}, CompletionTokenIDs: []int32{7}}
			d.checkRender(t.Context(), d.epByURL["http://a"], d.laneByName["short"], store.Claimed{ID: "s1", Turn: 1}, &turn{index: 1, body: []byte(`{"messages":[]}`)}, &res)
			if (tc.want == "") != (res.TokenIDsUnavailable == "") || !strings.Contains(res.TokenIDsUnavailable, tc.want) {
				t.Errorf("TokenIDsUnavailable = %q, want %q", res.TokenIDsUnavailable, tc.want)
			}
			if asked := len(cl.paths) > 0; asked != tc.asked || (asked && cl.paths[0] != route+" m") {
				t.Errorf("render asked %v, want %v", cl.paths, tc.asked)
			}
		})
	}
}

// TestBackupAnswerRenderChecked: an answer stored from a backup (hedge.go)
// goes through the render check like the first request's: its prompt ids
// differ from the render, so they are stored as unavailable, not exported.
func TestBackupAnswerRenderChecked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &backupRun{
			render:   []int32{1, 2, 9, 4},
			shortEnd: func() (llm.Result, error) { return answer("cut", "length", 100), nil },
			long: func(ctx context.Context, n int) (llm.Result, error) {
				time.Sleep(500 * time.Millisecond) // outlives the short request
				res := answer("the long answer", "stop", 400)
				res.PromptTokenIDs, res.CompletionTokenIDs = []int32{1, 2, 3, 4}, []int32{7}
				return res, nil
			},
		}
		d := r.run(t)
		if c := d.Snapshot().Counters; c.BackupsUsed != 1 {
			t.Fatalf("counters %+v: want the backup's answer used", c)
		}
		rec, err := reply.Decode(r.st.get("s-00000").result)
		if err != nil {
			t.Fatal(err)
		}
		if want := "at index 2: id 3 returned, 9 rendered"; !strings.Contains(rec.TokenIDsUnavailable, want) {
			t.Errorf("stored backup answer: TokenIDsUnavailable = %q, want it to contain %q", rec.TokenIDsUnavailable, want)
		}
	})
}

// slowRenderClient renders after a while, or fails with its context's end.
type slowRenderClient struct {
	Chatter
	ids  []int32
	took time.Duration
}

func (c *slowRenderClient) RenderChat(ctx context.Context, path string, req llm.Request) ([]int32, error) {
	select {
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	case <-time.After(c.took):
		return c.ids, nil
	}
}

// TestRenderCheckOutlivesTheDrain: an answer that settles as the run
// stops is render-checked to its end (tokenizeTimeout bounds it), not cut
// by the drain's cancel of in-flight requests: its good ids are not
// stored as unavailable because of our own shutdown.
func TestRenderCheckOutlivesTheDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 1)
		eps, _ := fleet(newTracker(), func(ctx context.Context, c call1) (llm.Result, error) {
			time.Sleep(time.Second)
			res := answer("an answer", "stop", 5)
			res.PromptTokenIDs, res.CompletionTokenIDs = []int32{1, 2, 3}, []int32{7}
			return res, nil
		}, "http://a")
		eps[0].Client = &slowRenderClient{Chatter: eps[0].Client, ids: []int32{1, 2, 3}, took: 3 * time.Second}
		cfg := baseConfig(st, eps)
		cfg.DrainTimeout = time.Second
		d := mustNew(t, cfg)
		d.SetServer("http://a", Server{Engine: "vllm", Render: "/v1/chat/completions/render"})
		ctx, cancel := context.WithCancel(t.Context())
		wait := runAsync(ctx, d)
		time.Sleep(1500 * time.Millisecond) // answered at 1s; its render runs to 4s
		cancel()                            // the drain gives up at 2.5s
		if err := wait(); !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v, want context.Canceled", err)
		}
		s := st.get("s-00000")
		rec, err := reply.Decode(s.result)
		if s.state != store.Done || err != nil {
			t.Fatalf("s-00000: %s, %v; want it done with its answer", s.state, err)
		}
		if rec.TokenIDsUnavailable != "" {
			t.Errorf("stored answer: TokenIDsUnavailable = %q, want its checked ids kept", rec.TokenIDsUnavailable)
		}
	})
}
