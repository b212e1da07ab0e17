package plan

import (
	"fmt"
	"strconv"
	"strings"
)

// planFlags renders the launch arguments. When the requested host cache
// does not fit, the flags carry the largest safe size instead (the plan is
// refused anyway; the flags show what would work).
func planFlags(p *Plan, in Input) {
	var f []string
	add := func(a ...string) { f = append(f, a...) }
	itoa := strconv.Itoa
	frac := strconv.FormatFloat(p.Memory.MemFraction, 'f', -1, 64)
	if in.Engine == VLLM {
		add("--tensor-parallel-size", itoa(in.TP))
		if in.DP > 1 {
			add("--data-parallel-size", itoa(in.DP))
		}
		add("--gpu-memory-utilization", frac)
		kv := p.KV.Dtype
		if kv == "bf16" {
			kv = "bfloat16"
		}
		add("--kv-cache-dtype", kv, "--block-size", itoa(p.Memory.PageSize))
		if p.Lanes != nil {
			add("--max-num-seqs", itoa(max(1, p.Lanes.MaxRunningRequests)))
		} else if in.MaxRunningRequests > 0 {
			add("--max-num-seqs", itoa(in.MaxRunningRequests))
		}
	} else {
		add("--tp", itoa(in.TP))
		if in.DP > 1 {
			add("--dp", itoa(in.DP))
		}
		add("--mem-fraction-static", frac, "--kv-cache-dtype", p.KV.Dtype)
		if p.Memory.PageSize > 1 {
			add("--page-size", itoa(p.Memory.PageSize))
		}
		if in.MaxTotalTokens > 0 {
			add("--max-total-tokens", strconv.FormatInt(in.MaxTotalTokens, 10))
		}
		if p.Lanes != nil {
			add("--max-running-requests", itoa(max(1, p.Lanes.MaxRunningRequests)))
		} else if in.MaxRunningRequests > 0 {
			add("--max-running-requests", itoa(in.MaxRunningRequests))
		}
		if hc := p.HostCache; hc != nil {
			switch {
			case !hc.Fits && hc.MaxSafeSizeGB > 0:
				add("--enable-hierarchical-cache", "--hicache-size", itoa(hc.MaxSafeSizeGB))
				p.note("flags carry the largest safe --hicache-size %d instead of the requested size", hc.MaxSafeSizeGB)
			case !hc.Fits:
				p.note("flags leave the hierarchical cache off: no size fits host RAM")
			case hc.SizeGBPerRank > 0:
				add("--enable-hierarchical-cache", "--hicache-size", itoa(hc.SizeGBPerRank))
			default:
				add("--enable-hierarchical-cache", "--hicache-ratio", strconv.FormatFloat(hc.Ratio, 'f', -1, 64))
			}
		}
	}
	p.Flags = f
	p.YAML = ServerYAML(in.Engine, f, p.Memory.MaxTotalTokens)
}

// ServerYAML renders args as a job file's server section. A predicted KV
// pool (kvTokens > 0) goes in as kv_tokens, which sizes the launched
// server's share of the work until it reports its own pool.
func ServerYAML(engine Engine, args []string, kvTokens int64) string {
	var b strings.Builder
	b.WriteString("server:\n  engine: ")
	b.WriteString(string(engine))
	b.WriteString("\n  args: [")
	for i, a := range args {
		if i > 0 {
			b.WriteString(", ")
		}
		// Go's quoting of printable ASCII is valid YAML double-quoted text.
		b.WriteString(strconv.Quote(a))
	}
	b.WriteString("]\n")
	if kvTokens > 0 {
		fmt.Fprintf(&b, "  kv_tokens: %d   # predicted KV pool; the server's own figure replaces it once it reports\n", kvTokens)
	}
	return b.String()
}
