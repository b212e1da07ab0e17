package sim

import (
	"encoding/binary"
	"hash/fnv"
	"math"
)

// vocab holds the synthetic tokens. Every entry is JSON-safe (no quotes,
// backslashes or control bytes) so chunks can be built by appending bytes.
var vocab = func() []string {
	words := []string{
		"the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "on", "be", "by",
		"this", "are", "or", "from", "at", "an", "which", "data", "model", "token", "value",
		"system", "result", "answer", "first", "second", "then", "because", "therefore", "step",
		"function", "number", "list", "example", "case", "input", "output", "server", "request",
		"memory", "cache", "batch", "queue", "time", "rate", "load", "table", "file", "line",
		"we", "can", "will", "should", "must", "not", "all", "each", "some", "more", "less",
		"new", "old", "small", "large", "fast", "slow", "good", "simple", "clear", "true",
		"check", "compute", "return", "call", "read", "write", "count", "sum", "add", "split",
		"consider", "note", "assume", "given", "so", "thus", "hence", "also", "if", "when",
		"one", "two", "three", "four", "five", "ten", "hundred", "per", "over", "under",
		"after", "before", "between", "into", "out", "up", "down", "only", "just", "very",
		"Let", "The", "We", "First,", "Next,", "Finally,", "However,", "In", "This", "It",
		"x", "y", "n", "k", "i", "=", "+", "-", "*", "(", ")", ".", ",", ":", ";", "?",
	}
	out := make([]string, len(words))
	for i, w := range words {
		out[i] = " " + w
	}
	return out
}()

// splitmix64 is a small, well-mixed deterministic generator step.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// unit maps a 64-bit hash to [0, 1).
func unit(h uint64) float64 { return float64(h>>11) / (1 << 53) }

// tokenText is the i-th token of a response with the given seed.
func tokenText(seed uint64, i int) string {
	return vocab[splitmix64(seed^uint64(i)*0x2545f4914f6cdd1d)%uint64(len(vocab))]
}

// hasher builds request seeds and prefix hashes from request content.
type hasher struct{ h uint64 }

func newHasher(seed int64) hasher { return hasher{h: splitmix64(uint64(seed))} }

func (x *hasher) add(b []byte) {
	f := fnv.New64a()
	var s [8]byte
	binary.LittleEndian.PutUint64(s[:], x.h)
	f.Write(s[:])
	f.Write(b)
	x.h = splitmix64(f.Sum64())
}

// estimateTokens is the deterministic prompt-token estimate for a byte count.
func estimateTokens(n int, bytesPerToken float64) int {
	if n <= 0 {
		return 0
	}
	return int(math.Ceil(float64(n) / bytesPerToken))
}

// outputPlan is what a request will generate, fixed at arrival from its seed.
type outputPlan struct {
	target    int    // tokens to generate
	finish    string // stop | length | tool_calls
	reasoning int    // leading tokens that are reasoning_content
	toolStart int    // first token that belongs to the tool call; -1 = no tool call
}

// planOutput draws the output length: lognormal around mean, a fraction
// forced to max_tokens so truncation happens, always capped at maxNew.
func planOutput(cfg *Config, seed uint64, maxNew int, thinking, tools bool) outputPlan {
	u0 := unit(splitmix64(seed ^ 0x1))
	u1 := unit(splitmix64(seed ^ 0x2))
	u2 := unit(splitmix64(seed ^ 0x3))
	u3 := unit(splitmix64(seed ^ 0x4))
	p := outputPlan{finish: "stop", toolStart: -1}
	if u0 < cfg.TruncateFraction {
		p.target = maxNew
	} else {
		sigma := cfg.OutputSigma
		mu := math.Log(float64(max(cfg.OutputMean, 1))) - sigma*sigma/2
		// Box-Muller with u1 in (0,1].
		z := math.Sqrt(-2*math.Log(1-u1)) * math.Cos(2*math.Pi*u2)
		p.target = max(1, int(math.Round(math.Exp(mu+sigma*z))))
	}
	if p.target >= maxNew {
		p.target = maxNew
		p.finish = "length"
	}
	if thinking {
		p.reasoning = int(math.Round(float64(p.target) * cfg.ReasoningFraction))
	}
	if tools && u3 < cfg.ToolCallFraction {
		p.toolStart = max(p.reasoning, p.target/2)
		if p.toolStart >= p.target {
			p.toolStart = p.target - 1
		}
		if p.finish == "stop" {
			p.finish = "tool_calls"
		}
	}
	return p
}
