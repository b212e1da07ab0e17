package plan

import (
	"fmt"
	"strings"
)

// planHeadline states a shortfall first: when the KV pool (or the running
// cap) holds fewer requests than the lanes ask for, how many fit and what
// would change that, so the figure is not found only inside the lanes'
// arithmetic.
func planHeadline(p *Plan, in Input) {
	lp := p.Lanes
	if lp == nil {
		return
	}
	wanted, fits := 0, 0
	var asked, fit []string
	for _, x := range lp.Lanes {
		wanted += x.Wanted
		fits += x.Recommended
		asked = append(asked, fmt.Sprintf("%s %d", x.Name, x.Wanted))
		fit = append(fit, fmt.Sprintf("%s %d", x.Name, x.Recommended))
	}
	if fits >= wanted {
		return
	}
	what := "KV fits"
	if lp.Scale >= 1 {
		what = "the running-request cap allows"
	}
	p.Headline = append(p.Headline,
		fmt.Sprintf("%s ~%d of the %d requests you asked for (%s; planned %s). Options:", what, fits, wanted, strings.Join(asked, ", "), strings.Join(fit, ", ")),
		fmt.Sprintf("run with what fits: lane concurrency %s (the flags below cap the server at %d running per replica)", strings.Join(fit, ", "), lp.MaxRunningRequests))
	if lp.Scale >= 1 {
		p.Headline = append(p.Headline, "raise the cap: --max-running-requests, if the KV pool can hold more (see LANES)")
		return
	}
	var per []string
	for _, x := range lp.Lanes {
		per = append(per, fmt.Sprintf("%s %d", x.Name, x.TokensPerRequest))
	}
	p.Headline = append(p.Headline, fmt.Sprintf("lower max_tokens where answers are shorter: each running request holds its prompt and output in KV (%s tokens)", strings.Join(per, ", ")))
	if p.KV.ElemBytes > 1 {
		p.Headline = append(p.Headline, fmt.Sprintf("store KV in fp8 (--kv-cache-dtype fp8_e4m3): 1 byte a value instead of %d, about %dx the requests, at some cost in accuracy", p.KV.ElemBytes, p.KV.ElemBytes))
	}
	p.Headline = append(p.Headline, fmt.Sprintf("more KV: more GPUs per replica or more replicas (now TP %d, DP %d), or a higher memory fraction (see GPU MEMORY)", in.TP, in.DP))
}
