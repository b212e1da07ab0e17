package dispatch

import (
	"context"
	"strings"
	"testing"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

// renderingChatter is a client whose server renders every request as ids.
type renderingChatter struct {
	fakeChatter
	ids   []int32
	paths []string
}

func (c *renderingChatter) RenderChat(ctx context.Context, path string, req llm.Request) ([]int32, error) {
	c.paths = append(c.paths, path+" "+req.Model)
	return c.ids, nil
}

// TestCheckRender: an answer whose prompt ids equal the server's render
// keeps them; one that differs is marked unavailable at the first
// differing index (an id, or where one is shorter); without a render route
// nothing is asked.
func TestCheckRender(t *testing.T) {
	const route = "/v1/chat/completions/render"
	for _, tc := range []struct {
		name     string
		route    string
		rendered []int32
		want     string // part of TokenIDsUnavailable; "" when kept
		asked    bool
	}{
		{"equal", route, []int32{1, 2, 3, 4}, "", true},
		{"one id off", route, []int32{1, 2, 9, 4}, "turn 2's prompt ids differ from the server's render of its messages (POST /v1/chat/completions/render) at index 2: id 3 returned, 9 rendered", true},
		{"render longer", route, []int32{1, 2, 3, 4, 5}, "at index 4: 4 ids returned, 5 rendered", true},
		{"no render route", "", []int32{9}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := &renderingChatter{fakeChatter: fakeChatter{url: "http://a", tr: newTracker()}, ids: tc.rendered}
			d := mustNew(t, baseConfig(newFakeStore(), []Endpoint{{URL: "http://a", Client: cl}}))
			d.SetServer("http://a", Server{Engine: "vllm", Render: tc.route})
			res := llm.Result{PromptTokenIDs: []int32{1, 2, 3, 4}, CompletionTokenIDs: []int32{7}}
			c := &call{ep: d.epByURL["http://a"], lane: d.laneByName["short"]}
			d.checkRender(t.Context(), c, store.Claimed{ID: "s1", Turn: 1}, &turn{index: 1, body: []byte(`{"messages":[]}`)}, &res)
			if (tc.want == "") != (res.TokenIDsUnavailable == "") || !strings.Contains(res.TokenIDsUnavailable, tc.want) {
				t.Errorf("TokenIDsUnavailable = %q, want %q", res.TokenIDsUnavailable, tc.want)
			}
			if asked := len(cl.paths) > 0; asked != tc.asked || (asked && cl.paths[0] != route+" m") {
				t.Errorf("render asked %v, want %v", cl.paths, tc.asked)
			}
		})
	}
}
