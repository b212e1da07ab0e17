package plan

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// SGLangDefaultMaxRunning is SGLang's max_running_requests when none is
// given (resolve_max_num_reqs, docs/engines.md §1.5): tokens/context_len*512
// clamped to [2048, 4096], then at most tokens/2.
func SGLangDefaultMaxRunning(tokens int64, contextLen int) int {
	if contextLen <= 0 {
		return int(tokens / 2)
	}
	est := min(max(int(float64(tokens)/float64(contextLen)*512), 2048), 4096)
	return min(est, int(tokens/2))
}

// planLanes splits the KV capacity between lanes.
//
// A request occupies prompt + generated tokens, growing to prompt + output
// at its end; over its life it averages prompt + output/2. Budgeting
// prompt_mean + output_mean per running request therefore leaves half the
// mean output as slack per request for length spread. On top of that one
// p95 request (prompt_p95 + output_p95 of the longest lane) is kept free
// per replica, so a long outlier does not force retractions. The usable
// tokens are shared in proportion to each lane's wanted concurrency: every
// lane gets the same fraction of what it asked for.
func planLanes(p *Plan, in Input) {
	if len(in.Lanes) == 0 {
		return
	}
	C := p.Memory.MaxTotalTokens
	reps := int64(in.DP)
	lp := &LanesPlan{Replicas: in.DP, CapacityTokens: C * reps}
	var longest, headroom int64
	longestName := ""
	var assumed []string
	for _, l := range in.Lanes {
		x := LanePlan{Lane: l}
		if x.PromptMean == 0 {
			x.PromptMean = in.PromptTokens
		}
		if x.PromptMean == 0 {
			x.PromptMean = DefaultPromptTokens
			assumed = append(assumed, x.Name)
		}
		if x.PromptP95 < x.PromptMean {
			x.PromptP95 = x.PromptMean
		}
		if x.OutputMean == 0 {
			x.OutputMean = in.OutputTokens
		}
		if x.OutputMean == 0 || x.OutputMean > x.MaxTokens {
			x.OutputMean = x.MaxTokens
		}
		if x.OutputP95 == 0 || x.OutputP95 > x.MaxTokens {
			x.OutputP95 = x.MaxTokens
		}
		x.OutputP95 = max(x.OutputP95, x.OutputMean)
		x.TokensPerRequest = int64(x.PromptMean + x.OutputMean)
		x.LongestRequest = int64(x.PromptP95 + x.MaxTokens)
		if x.LongestRequest > longest {
			longest, longestName = x.LongestRequest, x.Name
		}
		headroom = max(headroom, int64(x.PromptP95+x.OutputP95))
		lp.Lanes = append(lp.Lanes, x)
	}
	if len(assumed) > 0 {
		p.estimate("prompt length: %d tokens assumed for lane %s (give it as name:concurrency:max_tokens:prompt_mean, set --prompt-tokens, or use --from-job for the lengths a run measured)",
			DefaultPromptTokens, strings.Join(assumed, ", "))
	}
	if C < longest {
		p.refuse(RefuseKVTooSmall, "KV capacity is smaller than one long request",
			fmt.Sprintf("lane %s: prompt p95 + max_tokens = %d tokens > max_total_num_tokens %d", longestName, longest, C),
			"raise the mem fraction, use fp8 KV, more GPUs per replica, or lower max_tokens")
	}
	lp.HeadroomTokens = headroom * reps
	lp.UsableTokens = max(0, lp.CapacityTokens-lp.HeadroomTokens)

	for i := range lp.Lanes {
		x := &lp.Lanes[i]
		x.Wanted = x.Concurrency
		if x.Wanted == 0 { // as many as fit alone
			x.Wanted = int(lp.UsableTokens / x.TokensPerRequest)
		}
		lp.DemandTokens += int64(x.Wanted) * x.TokensPerRequest
	}
	lp.Scale = 1
	if lp.DemandTokens > lp.UsableTokens {
		lp.Scale = float64(lp.UsableTokens) / float64(lp.DemandTokens)
	}

	// Running-request cap per replica: the user's, else the engine's.
	hard := int(C / 2) // SGLang caps any value at tokens/2 (docs/engines.md §1.5)
	switch {
	case in.MaxRunningRequests > 0:
		lp.RunningCap, lp.RunningCapSource = min(in.MaxRunningRequests, max(hard, 1)), "given --max-running-requests"
	case in.Engine == SGLang:
		ctx := in.ContextLen
		if ctx == 0 {
			ctx = in.Model.ContextLen
		}
		lp.RunningCap, lp.RunningCapSource = max(hard, 1), "SGLang hard cap max_total_num_tokens/2 (the flag below replaces its default)"
		p.note("SGLang's default max_running_requests here would be %d (docs/engines.md §1.5); the flag overrides it", SGLangDefaultMaxRunning(C, ctx))
	default:
		lp.RunningCap, lp.RunningCapSource = math.MaxInt32, "no cap given; vLLM --max-num-seqs is set from the lanes"
	}

	sum := 0
	for i := range lp.Lanes {
		x := &lp.Lanes[i]
		x.Recommended = int(math.Floor(float64(x.Wanted) * lp.Scale))
		if x.Recommended == 0 && x.Wanted > 0 && lp.UsableTokens >= x.TokensPerRequest {
			x.Recommended = 1
		}
		sum += x.Recommended
	}
	capTotal := int64(lp.RunningCap) * reps
	if int64(sum) > capTotal {
		f := float64(capTotal) / float64(sum)
		sum = 0
		for i := range lp.Lanes {
			x := &lp.Lanes[i]
			x.Recommended = max(int(math.Floor(float64(x.Recommended)*f)), min(x.Recommended, 1))
			sum += x.Recommended
		}
	}
	for i := range lp.Lanes {
		x := &lp.Lanes[i]
		x.KVTokens = int64(x.Recommended) * x.TokensPerRequest
		x.Math = fmt.Sprintf("need %d + %d = %d tok/req; wanted %d x scale %.3f = %d running, %d KV tokens",
			x.PromptMean, x.OutputMean, x.TokensPerRequest, x.Wanted, lp.Scale, x.Recommended, x.KVTokens)
	}
	lp.MaxRunningRequests = int(ceilDiv(int64(sum), reps))
	lp.Formula = []string{
		fmt.Sprintf("capacity = %d tokens x %d replica(s) = %d", C, reps, lp.CapacityTokens),
		fmt.Sprintf("headroom = one p95 request (prompt p95 + output p95) = %d x %d replica(s) = %d", headroom, reps, lp.HeadroomTokens),
		fmt.Sprintf("usable = %d - %d = %d tokens", lp.CapacityTokens, lp.HeadroomTokens, lp.UsableTokens),
		fmt.Sprintf("demand = sum(wanted x (prompt mean + output mean)) = %d tokens; scale = min(1, usable/demand) = %.3f", lp.DemandTokens, lp.Scale),
	}
	if lp.RunningCap == math.MaxInt32 {
		lp.Formula = append(lp.Formula, fmt.Sprintf("running cap: %s; running requests flag = %d per replica", lp.RunningCapSource, lp.MaxRunningRequests))
	} else {
		lp.Formula = append(lp.Formula, fmt.Sprintf("running cap %d per replica (%s); running requests flag = %d per replica", lp.RunningCap, lp.RunningCapSource, lp.MaxRunningRequests))
	}
	p.Lanes = lp
}

// ParseLane parses "name:concurrency:max_tokens" optionally followed by
// ":prompt_mean:output_mean:prompt_p95:output_p95" (any suffix may be
// left off; empty fields stay zero, meaning "use the default").
func ParseLane(s string) (Lane, error) {
	f := strings.Split(s, ":")
	if len(f) < 3 || len(f) > 7 || f[0] == "" {
		return Lane{}, fmt.Errorf("lane %q: want name:concurrency:max_tokens[:prompt_mean[:output_mean[:prompt_p95[:output_p95]]]]", s)
	}
	l := Lane{Name: f[0]}
	dst := []*int{&l.Concurrency, &l.MaxTokens, &l.PromptMean, &l.OutputMean, &l.PromptP95, &l.OutputP95}
	names := []string{"concurrency", "max_tokens", "prompt_mean", "output_mean", "prompt_p95", "output_p95"}
	for i, v := range f[1:] {
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return Lane{}, fmt.Errorf("lane %q: %s %q is not a non-negative integer", s, names[i], v)
		}
		*dst[i] = n
	}
	return l, nil
}
