package main

import (
	"bytes"
	"strings"
	"testing"
)

// The command line a user types from the card's box plans the real card
// and says how it read the size.
func TestPlanGPUMemFromTheBox(t *testing.T) {
	o := planOptions{model: "../../internal/plan/testdata/kimi-k2.5.json", gpuMem: "96GB", gpus: 8, tp: 8, dp: 1,
		hostMem: "449GB", memFraction: 0.93, engine: "sglang", kvDtype: "auto"}
	var out bytes.Buffer
	if err := runPlan(o, &out); err != nil {
		t.Fatalf("runPlan: %v\n%s", err, out.String())
	}
	for _, want := range []string{
		"on 8 x RTX PRO 6000 Blackwell",
		"max_total_num_tokens       ~  241250 tokens",
		"96GB read as GPU memory is sold: 96.00 GiB nominal, not 89.41 GiB of decimal bytes",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("plan output lacks %q:\n%s", want, out.String())
		}
	}
}
