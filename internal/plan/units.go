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
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return !(unicode.IsDigit(r) || r == '.') })
	numPart, unit := t, ""
	if i >= 0 {
		numPart, unit = t[:i], strings.TrimSpace(t[i:])
	}
	v, err := strconv.ParseFloat(numPart, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("size %q: want a number with a unit like 96GB, 95.59GiB or 97887MiB", s)
	}
	var mult float64
	switch strings.ToLower(unit) {
	case "", "b":
		mult = 1
	case "k", "kb":
		mult = 1e3
	case "m", "mb":
		mult = 1e6
	case "g", "gb":
		mult = 1e9
	case "t", "tb":
		mult = 1e12
	case "ki", "kib":
		mult = float64(KiB)
	case "mi", "mib":
		mult = float64(MiB)
	case "gi", "gib":
		mult = float64(GiB)
	case "ti", "tib":
		mult = float64(1 << 40)
	default:
		return 0, fmt.Errorf("size %q: unknown unit %q", s, unit)
	}
	return int64(math.Round(v * mult)), nil
}

// GPU is one accelerator model with the memory nvidia-smi reports as
// memory.total, which is what torch sees as the device's total.
type GPU struct {
	Name     string `json:"name"`
	MemBytes int64  `json:"mem_bytes"`
	// Source says where MemBytes comes from.
	Source string `json:"source"`
	// Marketed is the advertised size in decimal GB, used to warn when a
	// user types the marketing number instead of the real one.
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

// ParseGPU accepts a table name or a size. A decimal-GB size that equals a
// known card's marketed size gets a note: the card's real memory differs.
func ParseGPU(s string) (GPU, []string, error) {
	if g, ok := LookupGPU(s); ok {
		return g, nil, nil
	}
	b, err := ParseBytes(s)
	if err != nil {
		return GPU{}, nil, fmt.Errorf("gpu %q: not a known name (%s) and not a size: %w", s, strings.Join(GPUNames(), ", "), err)
	}
	g := GPU{Name: "custom", MemBytes: b, Source: "user: " + s}
	var notes []string
	for _, k := range knownGPUs {
		if b == int64(k.gpu.Marketed)*GB {
			notes = append(notes, fmt.Sprintf("%s read as %.2f GiB; an %s reports %.2f GiB (%s): pass --gpu %s for its real size",
				s, gib(b), k.gpu.Name, gib(k.gpu.MemBytes), k.gpu.Source, k.aliases[0]))
		}
	}
	return g, notes, nil
}

func gib(b int64) float64 { return float64(b) / float64(GiB) }
func gb(b int64) float64  { return float64(b) / float64(GB) }
