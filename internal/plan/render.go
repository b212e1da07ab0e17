package plan

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteText renders the plan as an aligned table. Rows whose value is a
// prediction or rests on an estimate are marked "~"; the ESTIMATES section
// says what each estimate is.
func (p *Plan) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	pr := func(format string, a ...any) { fmt.Fprintf(tw, format+"\n", a...) }
	row := func(est bool, label, value, note string) {
		mark := ""
		if est {
			mark = "~"
		}
		pr("  %s\t%s\t%s\t%s", label, mark, value, note)
	}

	moe := ""
	if p.Model.MoE {
		moe = ", MoE"
	}
	pr("regen plan: %s (%s, %d layers%s, %s) on %d x %s, TP %d, DP %d, engine %s",
		nonEmpty(p.Model.Name, "model"), p.Model.Attention, p.Model.Layers, moe, p.Model.Dtype, p.GPU.Count, p.GPU.Name, p.GPU.TP, p.GPU.DP, p.Engine)
	pr("")
	pr("GPU")
	row(false, "memory per GPU", fmt.Sprintf("%.2f GiB", gib(p.GPU.MemBytes)), p.GPU.Source)

	pr("WEIGHTS")
	westEst := p.Weights.Estimated
	row(westEst, "total", fmt.Sprintf("%.2f GiB", gib(p.Weights.TotalBytes)), p.Weights.Source)
	row(true, "per rank", fmt.Sprintf("%.2f GiB", gib(p.Weights.PerRankBytes)), fmt.Sprintf("of which %.2f GiB replicated on every rank", gib(p.Weights.ReplicatedBytes)))
	for _, part := range p.Weights.Breakdown.Parts {
		state := "split"
		if part.Replicated {
			state = "replicated"
		}
		if !part.Loaded {
			state = "not loaded"
		}
		row(true, "  "+part.Name, fmt.Sprintf("%.2f GiB/rank", gib(part.PerRankBytes)), fmt.Sprintf("%.2f GiB total, %.2fB params, %s, %s", gib(part.Bytes), float64(part.Params)/1e9, part.Format, state))
	}

	pr("KV CACHE")
	row(false, "dtype", fmt.Sprintf("%s (%d B)", p.KV.Dtype, p.KV.ElemBytes), p.KV.DtypeSource)
	repl := ""
	if p.KV.ReplicatedAcrossTP {
		repl = "replicated on every TP rank"
	}
	row(false, "bytes per token per rank", fmt.Sprintf("%d B", p.KV.CellBytes), repl)
	row(false, "", "", p.KV.Formula)

	mem := p.Memory
	pr("GPU MEMORY (per rank)")
	row(true, "P free before weights", fmt.Sprintf("%.2f GiB", gib(mem.FreeBeforeWeightsBytes)), "")
	label := "--mem-fraction-static"
	if p.Engine == VLLM {
		label = "gpu_memory_utilization"
	}
	row(false, label, fmt.Sprintf("%.3f", mem.MemFraction), mem.MemFractionSource)
	act := "activation minimum"
	if p.Engine == VLLM {
		act = "activation peak (subtracted)"
	}
	row(true, "slack outside static pool", fmt.Sprintf("%.2f GiB", gib(mem.SlackBytes)), fmt.Sprintf("%s %.2f GiB", act, gib(mem.ActivationBytes)))
	row(true, "KV pool", fmt.Sprintf("%.2f GiB", gib(mem.KVPoolBytes)), "")
	name := "max_total_num_tokens"
	if p.Engine == VLLM {
		name = "GPU KV cache size"
	}
	row(true, name, fmt.Sprintf("%d tokens", mem.MaxTotalTokens), fmt.Sprintf("page %d", mem.PageSize))
	for _, l := range mem.Formula {
		row(false, "", "", l)
	}

	if hc := p.HostCache; hc != nil {
		pr("HOST CACHE (HiCache, per rank)")
		row(false, "bytes per token", fmt.Sprintf("%d B", hc.BytesPerToken), "")
		row(hc.SizeGBPerRank == 0, "tokens per rank", fmt.Sprintf("%d", hc.TokensPerRank), "")
		row(hc.SizeGBPerRank == 0, "per rank", fmt.Sprintf("%.2f GB", gb(hc.BytesPerRank)), "decimal GB")
		row(hc.SizeGBPerRank == 0, "total", fmt.Sprintf("%.2f GB", gb(hc.TotalBytes)), fmt.Sprintf("%d ranks", hc.Ranks))
		row(true, "largest safe --hicache-size", fmt.Sprintf("%d", hc.MaxSafeSizeGB), "GB per rank")
		for _, l := range hc.Formula {
			row(false, "", "", l)
		}
	}
	if h := p.Host; h != nil {
		pr("HOST RAM")
		row(false, "total", fmt.Sprintf("%.2f GB", gb(h.TotalBytes)), "")
		row(true, "process overhead", fmt.Sprintf("%.2f GB", gb(h.OverheadBytes)), "")
		row(false, "safety margin", fmt.Sprintf("%.2f GB", gb(h.MarginBytes)), fmt.Sprintf("%.0f%%", h.MarginFraction*100))
		if h.ReserveBytes > 0 {
			row(false, "SGLang reserve", fmt.Sprintf("%.2f GB", gb(h.ReserveBytes)), "10 GiB per rank")
			row(false, "host cache", fmt.Sprintf("%.2f GB", gb(h.HostCacheBytes)), "")
		}
		row(true, "left", fmt.Sprintf("%.2f GB", gb(h.LeftBytes)), "")
	}
	if lp := p.Lanes; lp != nil {
		pr("LANES")
		for _, l := range lp.Formula {
			row(false, "", "", l)
		}
		for _, x := range lp.Lanes {
			row(true, "lane "+x.Name, fmt.Sprintf("%d running", x.Recommended), x.Math)
		}
	}
	pr("FLAGS")
	pr("  %s", strings.Join(p.Flags, " "))
	if err := tw.Flush(); err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("\n")
	b.WriteString(p.YAML)
	if len(p.Estimates) > 0 {
		b.WriteString("\nESTIMATES (~)\n")
		for _, e := range p.Estimates {
			b.WriteString("  - " + e + "\n")
		}
		b.WriteString("  - max_total_num_tokens is a prediction: the server's /get_server_info is the truth\n")
	}
	if len(p.Notes) > 0 {
		b.WriteString("\nNOTES\n")
		for _, n := range p.Notes {
			b.WriteString("  - " + n + "\n")
		}
	}
	if len(p.Refusals) > 0 {
		b.WriteString("\nREFUSED\n")
		for _, r := range p.Refusals {
			b.WriteString("  - " + r.Summary + "\n")
			for _, l := range r.Lines {
				b.WriteString("      " + l + "\n")
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
