package plan

import "testing"

func TestObserved(t *testing.T) {
	prompt := make([]int, 100)
	output := make([]int, 100)
	for i := range prompt {
		prompt[i] = i + 1          // 1..100: mean 50.5 -> 51 (rounded), p95 95
		output[i] = 1000 * (i % 2) // half 0, half 1000: mean 500, p95 1000
	}
	got := Observed(Lane{Name: "short", Concurrency: 150, MaxTokens: 10240}, prompt, output)
	want := Lane{Name: "short", Concurrency: 150, MaxTokens: 10240, PromptMean: 51, PromptP95: 95, OutputMean: 500, OutputP95: 1000}
	if got != want {
		t.Errorf("Observed() = %+v, want %+v", got, want)
	}
	if l := Observed(Lane{Name: "x"}, nil, nil); l.PromptMean != 0 || l.OutputP95 != 0 {
		t.Errorf("Observed(no data) = %+v, want zero lengths", l)
	}
}
