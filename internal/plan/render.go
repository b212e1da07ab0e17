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
	t := table{tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	moe := ""
	if p.Model.MoE {
		moe = ", MoE"
	}
	t.line("regen plan: %s (%s, %d layers%s, %s) on %d x %s, TP %d, DP %d, engine %s",
		nonEmpty(p.Model.Name, "model"), p.Model.Attention, p.Model.Layers, moe, p.Model.Dtype, p.GPU.Count, p.GPU.Name, p.GPU.TP, p.GPU.DP, p.Engine)
	t.line("")
	if len(p.Headline) > 0 {
		t.line("%s", p.Headline[0])
		for _, h := range p.Headline[1:] {
			t.line("  - %s", h)
		}
		t.line("")
	}
	t.line("GPU")
	t.row(false, "memory per GPU", fmt.Sprintf("%.2f GiB", gib(p.GPU.MemBytes)), p.GPU.Source)
	p.writeWeights(t)
	p.writeKV(t)
	p.writeMemory(t)
	if p.HostCache != nil {
		p.HostCache.write(t)
	}
	if p.Host != nil {
		p.Host.write(t)
	}
	if lp := p.Lanes; lp != nil {
		t.line("LANES")
		t.formula(lp.Formula)
		for _, x := range lp.Lanes {
			t.row(true, "lane "+x.Name, fmt.Sprintf("%d running", x.Recommended), x.Math)
		}
	}
	if len(p.Refusals) > 0 {
		t.line("FLAGS (the plan is refused: see REFUSED below)")
	} else {
		t.line("FLAGS")
	}
	t.line("  %s", strings.Join(p.Flags, " "))
	if err := t.tw.Flush(); err != nil {
		return err
	}
	_, err := io.WriteString(w, p.trailer())
	return err
}

// table is the plan's aligned part: section headings, and rows of label,
// estimate mark, value and note.
type table struct{ tw *tabwriter.Writer }

func (t table) line(format string, a ...any) { fmt.Fprintf(t.tw, format+"\n", a...) }

// row writes one fact; est marks a value that is a prediction or rests on
// an estimate.
func (t table) row(est bool, label, value, note string) {
	mark := ""
	if est {
		mark = "~"
	}
	t.line("  %s\t%s\t%s\t%s", label, mark, value, note)
}

// formula writes the lines of a section's arithmetic in the note column.
func (t table) formula(lines []string) {
	for _, l := range lines {
		t.row(false, "", "", l)
	}
}

func (p *Plan) writeWeights(t table) {
	t.line("WEIGHTS")
	t.row(p.Weights.Estimated, "total", fmt.Sprintf("%.2f GiB", gib(p.Weights.TotalBytes)), p.Weights.Source)
	t.row(true, "per rank", fmt.Sprintf("%.2f GiB", gib(p.Weights.PerRankBytes)), fmt.Sprintf("of which %.2f GiB replicated on every rank", gib(p.Weights.ReplicatedBytes)))
	for _, part := range p.Weights.Breakdown.Parts {
		state := "split"
		if part.Replicated {
			state = "replicated"
		}
		if !part.Loaded {
			state = "not loaded"
		}
		t.row(true, "  "+part.Name, fmt.Sprintf("%.2f GiB/rank", gib(part.PerRankBytes)), fmt.Sprintf("%.2f GiB total, %.2fB params, %s, %s", gib(part.Bytes), float64(part.Params)/1e9, part.Format, state))
	}
}

func (p *Plan) writeKV(t table) {
	t.line("KV CACHE")
	t.row(false, "dtype", fmt.Sprintf("%s (%d B)", p.KV.Dtype, p.KV.ElemBytes), p.KV.DtypeSource)
	repl := ""
	if p.KV.ReplicatedAcrossTP {
		repl = "replicated on every TP rank"
	}
	t.row(false, "bytes per token per rank", fmt.Sprintf("%d B", p.KV.CellBytes), repl)
	t.row(false, "", "", p.KV.Formula)
}

// writeMemory writes the GPU memory section in the engine's own words.
func (p *Plan) writeMemory(t table) {
	mem := p.Memory
	fraction, act, pool := "--mem-fraction-static", "activation minimum", "max_total_num_tokens"
	if p.Engine == VLLM {
		fraction, act, pool = "gpu_memory_utilization", "activation peak (subtracted)", "GPU KV cache size"
	}
	t.line("GPU MEMORY (per rank)")
	t.row(true, "P free before weights", fmt.Sprintf("%.2f GiB", gib(mem.FreeBeforeWeightsBytes)), "")
	t.row(false, fraction, fmt.Sprintf("%.3f", mem.MemFraction), mem.MemFractionSource)
	t.row(true, "slack outside static pool", fmt.Sprintf("%.2f GiB", gib(mem.SlackBytes)), fmt.Sprintf("%s %.2f GiB", act, gib(mem.ActivationBytes)))
	t.row(true, "KV pool", fmt.Sprintf("%.2f GiB", gib(mem.KVPoolBytes)), "")
	t.row(true, pool, fmt.Sprintf("%d tokens", mem.MaxTotalTokens), fmt.Sprintf("page %d", mem.PageSize))
	t.formula(mem.Formula)
}

func (hc *HostCachePlan) write(t table) {
	t.line("HOST CACHE (HiCache, per rank)")
	t.row(false, "bytes per token", fmt.Sprintf("%d B", hc.BytesPerToken), "")
	t.row(hc.SizeGBPerRank == 0, "tokens per rank", fmt.Sprintf("%d", hc.TokensPerRank), "")
	t.row(hc.SizeGBPerRank == 0, "per rank", fmt.Sprintf("%.2f GB", gb(hc.BytesPerRank)), "decimal GB")
	t.row(hc.SizeGBPerRank == 0, "total", fmt.Sprintf("%.2f GB", gb(hc.TotalBytes)), fmt.Sprintf("%d ranks", hc.Ranks))
	t.row(true, "largest safe --hicache-size", fmt.Sprintf("%d", hc.MaxSafeSizeGB), "GB per rank")
	t.formula(hc.Formula)
}

func (h *HostPlan) write(t table) {
	t.line("HOST RAM")
	t.row(false, "total", fmt.Sprintf("%.2f GB", gb(h.TotalBytes)), "")
	t.row(true, "process overhead", fmt.Sprintf("%.2f GB", gb(h.OverheadBytes)), "")
	t.row(false, "safety margin", fmt.Sprintf("%.2f GB", gb(h.MarginBytes)), fmt.Sprintf("%.0f%%", h.MarginFraction*100))
	if h.ReserveBytes > 0 {
		t.row(false, "SGLang reserve", fmt.Sprintf("%.2f GB", gb(h.ReserveBytes)), "10 GiB per rank")
		t.row(false, "host cache", fmt.Sprintf("%.2f GB", gb(h.HostCacheBytes)), "")
	}
	t.row(true, "left", fmt.Sprintf("%.2f GB", gb(h.LeftBytes)), "")
}

// trailer is what follows the table, unaligned: the job file's YAML, then
// the estimates, notes and refusals.
func (p *Plan) trailer() string {
	var b strings.Builder
	b.WriteString("\n")
	if len(p.Refusals) > 0 {
		// A server section to copy would read as a plan that works.
		b.WriteString("no server section to copy: the plan is refused (REFUSED below); fix what it names and plan again\n")
	} else {
		b.WriteString(p.YAML)
	}
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
	return b.String()
}
