package plan

import (
	"fmt"
	"math"
)

// HostPoolTokens is SGLang's host KV pool size for one rank
// (HostKVCache.__init__, docs/engines.md §2): sizeGB*1e9 // bytesPerToken
// tokens, or deviceTokens*ratio when sizeGB is 0; then floored to pages
// plus one page.
func HostPoolTokens(sizeGB int, ratio float64, deviceTokens, bytesPerToken int64, pageSize int) int64 {
	var size int64
	if sizeGB > 0 {
		size = int64(float64(sizeGB) * 1e9 / float64(bytesPerToken))
	} else {
		size = int64(float64(deviceTokens) * ratio)
	}
	page := int64(max(pageSize, 1))
	return (size/page + 1) * page
}

// MaxSafeHiCacheSizeGB is the largest --hicache-size (whole decimal GB per
// rank, as SGLang takes it) whose pool fits perRankBudget bytes.
func MaxSafeHiCacheSizeGB(perRankBudget, bytesPerToken int64, pageSize int) int {
	if perRankBudget <= 0 {
		return 0
	}
	s := int(perRankBudget / GB)
	for s > 0 && HostPoolTokens(s, 0, 0, bytesPerToken, pageSize)*bytesPerToken > perRankBudget {
		s--
	}
	return s
}

func planHost(p *Plan, in Input) {
	ranks := in.TP * in.DP
	cell := p.KV.CellBytes
	var hc *HostCachePlan
	if in.HiCache.Enabled {
		hc = &HostCachePlan{Ranks: ranks, SizeGBPerRank: in.HiCache.SizeGB, BytesPerToken: cell}
		if hc.SizeGBPerRank == 0 {
			hc.Ratio = in.HiCache.Ratio
			if hc.Ratio == 0 {
				hc.Ratio = DefaultHiCacheRatio
			}
		}
		hc.TokensPerRank = HostPoolTokens(hc.SizeGBPerRank, hc.Ratio, p.Memory.MaxTotalTokens, cell, p.Memory.PageSize)
		hc.BytesPerRank = hc.TokensPerRank * cell
		hc.TotalBytes = hc.BytesPerRank * int64(ranks)
		if hc.SizeGBPerRank > 0 {
			hc.Formula = append(hc.Formula, fmt.Sprintf("--hicache-size %d is per rank: %d x 1e9 B / %d B/token = %d tokens (page-rounded, +1 page) = %.2f GB per rank",
				hc.SizeGBPerRank, hc.SizeGBPerRank, cell, hc.TokensPerRank, gb(hc.BytesPerRank)))
		} else {
			hc.Formula = append(hc.Formula, fmt.Sprintf("--hicache-ratio %g x %d device tokens = %d tokens (page-rounded, +1 page) x %d B = %.2f GB per rank",
				hc.Ratio, p.Memory.MaxTotalTokens, hc.TokensPerRank, cell, gb(hc.BytesPerRank)))
			if hc.Ratio < 2 {
				p.note("SGLang's HiCache design doc says the minimum --hicache-ratio is 2 (docs/engines.md §2)")
			}
		}
		hc.Formula = append(hc.Formula, fmt.Sprintf("x %d ranks (TP %d x DP %d; every rank allocates its own pool) = %.2f GB pinned host RAM", ranks, in.TP, in.DP, gb(hc.TotalBytes)))
		if hc.TokensPerRank <= p.Memory.MaxTotalTokens {
			p.note("host KV pool (%d tokens) is not larger than the device pool (%d tokens): SGLang warns, and some revisions refuse (docs/engines.md §2)", hc.TokensPerRank, p.Memory.MaxTotalTokens)
		}
		p.HostCache = hc
	}
	if in.HostMem <= 0 {
		return
	}

	h := &HostPlan{TotalBytes: in.HostMem, OverheadBaseBytes: in.HostOverheadBase, OverheadPerRank: in.HostOverheadPerRank, MarginFraction: in.HostMargin}
	if h.OverheadBaseBytes == 0 {
		h.OverheadBaseBytes = DefaultHostOverheadBase
	}
	if h.OverheadPerRank == 0 {
		h.OverheadPerRank = DefaultHostOverheadPerRank
	}
	if h.MarginFraction == 0 {
		h.MarginFraction = DefaultHostMargin
	}
	p.estimate("host overhead %.0f GiB + %d ranks x %.0f GiB per scheduler process, margin %.0f%% of host RAM (override --host-overhead, --host-overhead-per-rank, --host-margin)",
		gib(h.OverheadBaseBytes), ranks, gib(h.OverheadPerRank), h.MarginFraction*100)
	h.OverheadBytes = h.OverheadBaseBytes + h.OverheadPerRank*int64(ranks)
	h.MarginBytes = int64(math.Round(float64(h.TotalBytes) * h.MarginFraction))
	if hc != nil {
		h.ReserveBytes = HiCacheReservePerRank * int64(ranks)
		h.HostCacheBytes = hc.TotalBytes
	}
	h.BudgetForCacheBytes = h.TotalBytes - h.OverheadBytes - h.MarginBytes - h.ReserveBytes
	h.LeftBytes = h.BudgetForCacheBytes - h.HostCacheBytes
	p.Host = h
	if hc == nil {
		if h.LeftBytes < 0 {
			p.note("host RAM %.2f GB is below the estimated process overhead and margin (%.2f GB)", gb(h.TotalBytes), gb(h.OverheadBytes+h.MarginBytes))
		}
		return
	}

	perRankBudget := h.BudgetForCacheBytes / int64(ranks)
	hc.MaxSafeSizeGB = MaxSafeHiCacheSizeGB(perRankBudget, cell, p.Memory.PageSize)
	hc.Fits = h.LeftBytes >= 0
	line := func(label string, b int64, tail string) string {
		return fmt.Sprintf("%-48s %9.2f GB%s", label, gb(b), tail)
	}
	budgetLines := []string{
		line("host RAM", h.TotalBytes, ""),
		line(fmt.Sprintf("- process overhead %.0f GiB + %d ranks x %.0f GiB", gib(h.OverheadBaseBytes), ranks, gib(h.OverheadPerRank)), h.OverheadBytes, " (estimate)"),
		line(fmt.Sprintf("- safety margin %.0f%%", h.MarginFraction*100), h.MarginBytes, ""),
		line(fmt.Sprintf("- SGLang reserve %d ranks x 10 GiB", ranks), h.ReserveBytes, ""),
		line("= budget for host KV pools", h.BudgetForCacheBytes, fmt.Sprintf(" = %.2f GB per rank", gb(perRankBudget))),
	}
	safe := fmt.Sprintf("largest safe --hicache-size: %d (GB per rank) -> %d tokens, %.2f GB per rank, %.2f GB over %d ranks",
		hc.MaxSafeSizeGB, HostPoolTokens(hc.MaxSafeSizeGB, 0, 0, cell, p.Memory.PageSize), gb(HostPoolTokens(hc.MaxSafeSizeGB, 0, 0, cell, p.Memory.PageSize)*cell),
		gb(HostPoolTokens(hc.MaxSafeSizeGB, 0, 0, cell, p.Memory.PageSize)*cell*int64(ranks)), ranks)
	if hc.MaxSafeSizeGB == 0 {
		safe = "no --hicache-size fits: disable the hierarchical cache or add host RAM"
	}
	hc.Formula = append(hc.Formula, budgetLines...)
	hc.Formula = append(hc.Formula, safe)
	if !hc.Fits {
		lines := append([]string{}, budgetLines...)
		lines = append(lines, fmt.Sprintf("asked: %.2f GB per rank x %d ranks = %.2f GB > %.2f GB budget", gb(hc.BytesPerRank), ranks, gb(hc.TotalBytes), gb(h.BudgetForCacheBytes)))
		lines = append(lines, safe)
		p.refuse(RefuseHostCache, "hierarchical cache does not fit host RAM (--hicache-size is per TP rank)", lines...)
	}
}
