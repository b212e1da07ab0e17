package runner

import (
	"regexp"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/quality"
)

// qualityRules turns the job's quality block into the dispatcher's rules
// (patterns were compiled once already by validation, so this cannot fail
// for a loaded job).
func qualityRules(q job.Quality) (quality.Rules, error) {
	r := quality.Rules{
		Truncated: q.Truncated, Empty: q.Empty, Reasoning: q.Reasoning, ThinkTags: q.ThinkTags,
		ToolArgs: q.ToolArgs, ToolName: q.ToolName,
		Repetition: quality.Repetition{NGram: q.Repetition.NGram, MaxRepeats: q.Repetition.MaxRepeats},
	}
	for _, p := range q.Regex {
		re, err := regexp.Compile(p.Pattern)
		if err != nil {
			return quality.Rules{}, err
		}
		r.Patterns = append(r.Patterns, quality.Pattern{Name: p.Name, Re: re, Field: quality.Field(p.Field)})
	}
	return r, nil
}

// reasoningRule is what the reasoning rule expects of an answer.
func reasoningRule(g job.Generation) quality.Reasoning {
	switch {
	case g.Reasoning == job.ReasoningDisable:
		return quality.ReasoningForbidden
	case g.ReasoningAsked():
		return quality.ReasoningRequired
	}
	return quality.ReasoningAny
}
