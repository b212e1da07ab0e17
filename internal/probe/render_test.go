package probe

import (
	"context"
	"testing"

	"github.com/regen-dev/regen/internal/sim"
)

// TestRender: a current vLLM offers the chat render route, a previous one
// answers 404, and SGLang's dialect has none to ask for.
func TestRender(t *testing.T) {
	for _, tt := range []struct {
		engine, shape, dialect string
		want                   bool
	}{
		{"vllm", "current", "vllm", true},
		{"vllm", "previous", "vllm", false},
		{"sglang", "current", "sglang", false},
	} {
		c := sim.DefaultConfig()
		c.Engine, c.APIShape = tt.engine, tt.shape
		srv := serveSim(t, c)
		got, err := Render(context.Background(), srv.Client(), srv.URL, dialect(t, tt.dialect), "")
		if err != nil || got != tt.want {
			t.Errorf("%s %s: Render = %v, %v; want %v", tt.engine, tt.shape, got, err, tt.want)
		}
	}
}
