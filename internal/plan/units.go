package plan

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
)

// Byte units. GB is decimal (SGLang's --hicache-size is decimal GB, as is
// most host-RAM marketing); GiB is binary (torch and nvidia-smi).
const (
	KiB = int64(1) << 10
	MiB = int64(1) << 20
	GiB = int64(1) << 30
	GB  = int64(1_000_000_000)
)

// ParseBytes parses sizes like "96GB", "95.59GiB", "97887MiB", "449G",
// "1.5T" or a plain byte count. Single-letter and "B"-less units are
// decimal except the binary "Ki/Mi/Gi/Ti" spellings.
func ParseBytes(s string) (int64, error) {
	v, unit, err := splitSize(s)
	if err != nil {
		return 0, err
	}
	return int64(math.Round(v * unit.mult)), nil
}

// sizeUnit is a parsed unit: its multiplier and, for the decimal units,
// the binary one a GPU vendor means by it.
type sizeUnit struct {
	mult   float64
	binary float64 // 0 when the unit is already binary or plain bytes
}

func splitSize(s string) (float64, sizeUnit, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return !(unicode.IsDigit(r) || r == '.') })
	numPart, unit := t, ""
	if i >= 0 {
		numPart, unit = t[:i], strings.TrimSpace(t[i:])
	}
	v, err := strconv.ParseFloat(numPart, 64)
	if err != nil || v < 0 {
		return 0, sizeUnit{}, fmt.Errorf("size %q: want a number with a unit like 96GB, 95.59GiB or 97887MiB", s)
	}
	var u sizeUnit
	switch strings.ToLower(unit) {
	case "", "b":
		u = sizeUnit{mult: 1}
	case "k", "kb":
		u = sizeUnit{mult: 1e3, binary: float64(KiB)}
	case "m", "mb":
		u = sizeUnit{mult: 1e6, binary: float64(MiB)}
	case "g", "gb":
		u = sizeUnit{mult: 1e9, binary: float64(GiB)}
	case "t", "tb":
		u = sizeUnit{mult: 1e12, binary: float64(int64(1) << 40)}
	case "ki", "kib":
		u = sizeUnit{mult: float64(KiB)}
	case "mi", "mib":
		u = sizeUnit{mult: float64(MiB)}
	case "gi", "gib":
		u = sizeUnit{mult: float64(GiB)}
	case "ti", "tib":
		u = sizeUnit{mult: float64(int64(1) << 40)}
	default:
		return 0, sizeUnit{}, fmt.Errorf("size %q: unknown unit %q", s, unit)
	}
	return v, u, nil
}

// GPU is one accelerator model with the memory nvidia-smi reports as
// memory.total, which is what torch sees as the device's total.
type GPU struct {
	Name     string `json:"name"`
	MemBytes int64  `json:"mem_bytes"`
	// Source says where MemBytes comes from.
	Source string `json:"source"`
	// Marketed is the size the card is sold at, in GB as printed on the
	// box; a --gpu-mem of that size is matched to this card.
	Marketed int `json:"-"`
}

// knownGPUs holds only sizes with a source. nvidia-smi memory.total in MiB.
var knownGPUs = []struct {
	aliases []string
	gpu     GPU
}{
	// docs/engines.md §8: 97887 MiB for both the Workstation and Server Edition.
	{[]string{"rtx-pro-6000", "rtxpro6000", "rtx-pro-6000-blackwell", "pro6000"}, GPU{Name: "RTX PRO 6000 Blackwell", MemBytes: 97887 * MiB, Source: "nvidia-smi memory.total 97887 MiB (docs/engines.md §8)", Marketed: 96}},
	// nvidia-smi captures of "NVIDIA H100 80GB HBM3" in public repositories (code index): 81559 MiB.
	{[]string{"h100", "h100-80gb", "h100-sxm", "h100-80gb-hbm3"}, GPU{Name: "H100 80GB HBM3", MemBytes: 81559 * MiB, Source: "nvidia-smi captures in public repos (81559 MiB)", Marketed: 80}},
	// nvidia-smi captures of "NVIDIA H200" in public repositories: 143771 MiB.
	{[]string{"h200", "h200-141gb"}, GPU{Name: "H200", MemBytes: 143771 * MiB, Source: "nvidia-smi captures in public repos (143771 MiB)", Marketed: 141}},
	// nvidia-smi captures of A100/A800 80GB (SXM4 and PCIe): 81920 MiB.
	{[]string{"a100-80gb", "a100-80g", "a100-sxm4-80gb"}, GPU{Name: "A100 80GB", MemBytes: 81920 * MiB, Source: "nvidia-smi captures in public repos (81920 MiB)", Marketed: 80}},
	// nvidia-smi captures of A100-SXM4/PCIe 40GB: 40960 MiB.
	{[]string{"a100-40gb", "a100-40g"}, GPU{Name: "A100 40GB", MemBytes: 40960 * MiB, Source: "nvidia-smi captures in public repos (40960 MiB)", Marketed: 40}},
	// nvidia-smi capture "NVIDIA L40S 3MiB / 46068MiB" in a public repository.
	{[]string{"l40s"}, GPU{Name: "L40S", MemBytes: 46068 * MiB, Source: "nvidia-smi captures in public repos (46068 MiB)", Marketed: 48}},
	// nvidia-smi captures "8x NVIDIA B200 ... 183359MiB each" in public repositories.
	{[]string{"b200"}, GPU{Name: "B200", MemBytes: 183359 * MiB, Source: "nvidia-smi captures in public repos (183359 MiB)", Marketed: 192}},
}

// LookupGPU finds a GPU by name, ignoring case, spaces, dashes and an
// "nvidia" prefix ("RTX PRO 6000", "rtx-pro-6000", "NVIDIA H100").
func LookupGPU(name string) (GPU, bool) {
	key := normGPU(name)
	for _, g := range knownGPUs {
		for _, a := range g.aliases {
			if normGPU(a) == key {
				return g.gpu, true
			}
		}
	}
	return GPU{}, false
}

// GPUNames lists the built-in table's names, for help and error text.
func GPUNames() []string {
	out := make([]string, len(knownGPUs))
	for i, g := range knownGPUs {
		out[i] = g.aliases[0]
	}
	return out
}

func normGPU(s string) string {
	s = strings.ToLower(s)
	s = strings.TrimPrefix(strings.TrimSpace(s), "nvidia")
	var b strings.Builder
	for _, r := range s {
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// ParseGPU accepts a table name or a memory size per GPU.
//
// A size in binary units (GiB, MiB) or plain bytes is taken as written: it
// is what nvidia-smi and torch report. A size in GB (or MB, TB) is read the
// way the card's box means it: GPU memory is sold in binary units, so a
// "96 GB" card has a nominal 96 GiB, never 96 x 10^9 bytes (89.41 GiB, which
// would undersize the KV pool by a third). When a known card is sold at that
// size, its real usable memory is used instead of the nominal figure (an
// RTX PRO 6000 sold as 96 GB reports 97,887 MiB = 95.59 GiB); several
// matches take the smallest, so the plan never promises memory a card
// lacks. The notes say which reading was made.
func ParseGPU(s string) (GPU, []string, error) {
	if g, ok := LookupGPU(s); ok {
		return g, nil, nil
	}
	v, unit, err := splitSize(s)
	if err != nil {
		return GPU{}, nil, fmt.Errorf("gpu %q: not a known name (%s) and not a size: %w", s, strings.Join(GPUNames(), ", "), err)
	}
	if unit.binary == 0 {
		return GPU{Name: "custom", MemBytes: int64(math.Round(v * unit.mult)), Source: "user: " + s}, nil, nil
	}
	nominal := int64(math.Round(v * unit.binary))
	var match *GPU
	var names []string
	for _, k := range knownGPUs {
		if float64(k.gpu.Marketed)*float64(GB) != v*unit.mult {
			continue
		}
		names = append(names, k.gpu.Name)
		if match == nil || k.gpu.MemBytes < match.MemBytes {
			g := k.gpu
			match = &g
		}
	}
	if match == nil {
		g := GPU{Name: "custom", MemBytes: nominal, Source: fmt.Sprintf("user: %s, read as the nominal binary size", s)}
		return g, []string{fmt.Sprintf("%s read as GPU memory is sold: %.2f GiB nominal (not %.2f GiB of decimal bytes); no known card is sold at that size, so pass the memory.total nvidia-smi reports (e.g. --gpu-mem 97887MiB) for an exact plan",
			s, gib(nominal), v*unit.mult/float64(GiB))}, nil
	}
	g := *match
	g.Source = fmt.Sprintf("%s, matched from %s", g.Source, s)
	note := fmt.Sprintf("%s read as GPU memory is sold: %.2f GiB nominal, not %.2f GiB of decimal bytes; %s is sold at that size and reports %.0f MiB (%.2f GiB) usable, which the plan uses",
		s, gib(nominal), v*unit.mult/float64(GiB), g.Name, float64(g.MemBytes)/float64(MiB), gib(g.MemBytes))
	if len(names) > 1 {
		note += fmt.Sprintf(" (the smallest of %s; pass --gpu NAME for another)", strings.Join(names, ", "))
	}
	return g, []string{note}, nil
}

func gib(b int64) float64 { return float64(b) / float64(GiB) }
func gb(b int64) float64  { return float64(b) / float64(GB) }
