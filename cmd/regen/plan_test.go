package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// TestPlanGolden: the README's plan example fits and recommends its lanes
// with the prompt length it assumed said so; the same plan with a
// hierarchical cache too big for host RAM is refused with the arithmetic
// printed once, and exits 1 with a one-line summary.
func TestPlanGolden(t *testing.T) {
	base := planOptions{model: "../../examples/models/kimi-k2.5.json", gpu: "RTX-PRO-6000", gpus: 8, tp: 8, dp: 1,
		hostMem: "449GB", memFraction: 0.85, engine: "sglang", kvDtype: "auto"}
	for _, tc := range []struct {
		name   string
		mod    func(*planOptions)
		refuse bool
	}{
		{"readme", func(o *planOptions) { o.hicacheSize = 30; o.lanes = []string{"short:150:10240", "long:32:16384"} }, false},
		{"no-lanes", func(o *planOptions) {}, false},
		{"refused", func(o *planOptions) { o.hicacheSize = 300; o.lanes = []string{"short:150:10240", "long:32:16384"} }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.mod(&o)
			var out bytes.Buffer
			err := runPlan(o, &out)
			stderr := ""
			var ee *exitError
			switch {
			case err == nil && !tc.refuse:
			case errors.As(err, &ee) && ee.code == 1 && tc.refuse:
				stderr = "regen plan: " + ee.err.Error() + "\n"
			default:
				t.Fatalf("runPlan = %v, want refused %v", err, tc.refuse)
			}
			if tc.refuse {
				if n := strings.Count(out.String()+stderr, "asked: 300.00 GB per rank"); n != 1 {
					t.Errorf("the refusal's arithmetic appears %d times, want once", n)
				}
			}
			if unshipped := "ENGINES" + ".md"; strings.Contains(out.String()+stderr, unshipped) {
				t.Errorf("plan output cites %s, which does not ship", unshipped)
			}
			golden(t, "plan/"+tc.name+".golden", "stdout:\n"+out.String()+"stderr:\n"+stderr)
		})
	}
}
