package plan

import "sort"

// Observed summarises measured token lengths of one lane (from a finished or
// running job) as the mean and 95th percentile the lane model uses.
func Observed(l Lane, prompt, output []int) Lane {
	l.PromptMean, l.PromptP95 = meanP95(prompt)
	l.OutputMean, l.OutputP95 = meanP95(output)
	return l
}

func meanP95(v []int) (mean, p95 int) {
	if len(v) == 0 {
		return 0, 0
	}
	s := append([]int(nil), v...)
	sort.Ints(s)
	sum := 0
	for _, x := range s {
		sum += x
	}
	// Nearest-rank percentile: the smallest value with at least 95% at or below it.
	idx := (95*len(s)+99)/100 - 1
	return (sum + len(s)/2) / len(s), s[idx]
}
