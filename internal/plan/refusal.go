package plan

import "strings"

// RefusalKind says which rule a plan broke.
type RefusalKind string

// Refusal kinds.
const (
	// RefuseWeights: the weights per rank do not fit the GPU memory free before them.
	RefuseWeights RefusalKind = "weights"
	// RefuseActivations: the mem fraction leaves no KV pool, or less slack
	// for activations than the stated minimum.
	RefuseActivations RefusalKind = "activations"
	// RefuseUtilization: vLLM's gpu_memory_utilization asks for more than is free at startup.
	RefuseUtilization RefusalKind = "utilization"
	// RefuseHostCache: the hierarchical cache does not fit host RAM.
	RefuseHostCache RefusalKind = "host_cache"
	// RefuseKVTooSmall: the KV pool cannot hold one longest request.
	RefuseKVTooSmall RefusalKind = "kv_too_small"
)

// Refusal is one broken rule with its arithmetic, one step per line.
type Refusal struct {
	Kind    RefusalKind `json:"kind"`
	Summary string      `json:"summary"`
	Lines   []string    `json:"lines"`
}

// RefusalError is returned by Compute, together with the Plan, when the
// plan cannot work. Its text carries the arithmetic.
type RefusalError struct {
	Refusals []Refusal
}

func (e *RefusalError) Error() string {
	var b strings.Builder
	b.WriteString("plan refused")
	for _, r := range e.Refusals {
		b.WriteString("\n- ")
		b.WriteString(r.Summary)
		for _, l := range r.Lines {
			b.WriteString("\n    ")
			b.WriteString(l)
		}
	}
	return b.String()
}

// Has reports whether the error includes a refusal of kind k.
func (e *RefusalError) Has(k RefusalKind) bool {
	for _, r := range e.Refusals {
		if r.Kind == k {
			return true
		}
	}
	return false
}
