package engine

import (
	"fmt"
	"strings"
)

// Metrics is the engine-neutral view of one /metrics scrape. Counts over
// several label sets (data-parallel ranks) are summed; TokenUsage and
// MaxTotalTokens take the largest value. Present records which fields the
// scrape actually contained, since an absent metric is not a zero.
type Metrics struct {
	Running               float64 `json:"running"`
	Queued                float64 `json:"queued"`
	TokenUsage            float64 `json:"token_usage"` // 0..1
	GenerationTokensTotal float64 `json:"generation_tokens_total"`
	PromptTokensTotal     float64 `json:"prompt_tokens_total"`
	RetractionsTotal      float64 `json:"retractions_total"`
	MaxTotalTokens        float64 `json:"max_total_tokens"`
	// Slots is the number of requests a slot-bound server (llama-server's
	// --parallel) decodes at once; more only wait.
	Slots float64 `json:"slots,omitempty"`
	// Context is the most tokens (prompt and completion) one request may
	// hold: llama-server's per-slot n_ctx, vLLM's max_model_len.
	Context float64 `json:"context,omitempty"`
	// Ranks is the number of data-parallel ranks (pools) behind the URL
	// when the server lists them; MaxTotalTokens is then their sum and
	// TokenUsage the fullest rank's.
	Ranks   int   `json:"ranks,omitempty"`
	Present Field `json:"present"`
}

// Field is a bit set naming Metrics fields.
type Field uint16

// Metrics fields, for Metrics.Present.
const (
	FieldRunning Field = 1 << iota
	FieldQueued
	FieldTokenUsage
	FieldGenerationTokensTotal
	FieldPromptTokensTotal
	FieldRetractionsTotal
	FieldMaxTotalTokens
	FieldSlots
	FieldContext
)

// Has reports whether every field in f is set.
func (f Field) Has(g Field) bool { return f&g == g }

// Evidence lists the fields the scrape contained, name=value, for a status
// line: a metric the engine does not export is left out, not shown as 0.
func (m Metrics) Evidence() string {
	fields := []struct {
		bit    Field
		name   string
		format string
		v      float64
	}{
		{FieldRunning, "running", "%.0f", m.Running},
		{FieldQueued, "queued", "%.0f", m.Queued},
		{FieldTokenUsage, "token_usage", "%.2f", m.TokenUsage},
		{FieldGenerationTokensTotal, "generation_tokens_total", "%.0f", m.GenerationTokensTotal},
		{FieldPromptTokensTotal, "prompt_tokens_total", "%.0f", m.PromptTokensTotal},
		{FieldRetractionsTotal, "retractions_total", "%.0f", m.RetractionsTotal},
		{FieldMaxTotalTokens, "kv_pool", "%.0f", m.MaxTotalTokens},
		{FieldSlots, "slots", "%.0f", m.Slots},
		{FieldContext, "context", "%.0f", m.Context},
	}
	var parts []string
	for _, f := range fields {
		if m.Present.Has(f.bit) {
			parts = append(parts, f.name+"="+fmt.Sprintf(f.format, f.v))
		}
	}
	if len(parts) == 0 {
		return "no known series"
	}
	return strings.Join(parts, " ")
}
