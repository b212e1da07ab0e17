package review

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/reply"
	"github.com/regen-dev/regen/internal/store"
)

// Sample is one sample as a reviewer reads it.
type Sample struct {
	ID        string          `json:"id"`
	Partition string          `json:"partition"`
	State     string          `json:"state"`
	Lane      string          `json:"lane"`
	Attempts  int             `json:"attempts"`
	Origin    string          `json:"origin,omitempty"`
	Tools     json.RawMessage `json:"tools,omitempty"`
	// Planned is the number of turns the dataset's conversation asks for;
	// Turns holds them all, answered or not.
	Planned int    `json:"planned_turns"`
	Turns   []Turn `json:"turns"`
	// EndedEarly says why a done conversation stopped before its last
	// planned turn.
	EndedEarly string `json:"ended_early,omitempty"`
	// Rule and Evidence are a rejected sample's quality rule and why.
	Rule     string `json:"rule,omitempty"`
	Evidence string `json:"evidence,omitempty"`
	// Error is a dead letter's reason, or the last error of a sample
	// waiting for a retry.
	Error      string    `json:"error,omitempty"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	// OriginalsKept is false for a sample ingested before regen kept the
	// dataset's answers.
	OriginalsKept bool `json:"originals_kept"`
}

// Turn is one turn: what came before the answer, the dataset's answer and
// the model's.
type Turn struct {
	// Turn is the 0-based index of the turn in the plan (JSON "turn");
	// every view shows it as conversation.Ordinal(Turn): "turn 1 of 3".
	Turn int `json:"turn"`
	// Input is the dataset's messages before this answer: the prompt for
	// turn 0; a user message or the tool results of the recorded calls
	// for a later turn.
	Input []conversation.Message `json:"input"`
	// Original is the dataset's answer (its assistant messages), nil when
	// not kept.
	Original []conversation.Message `json:"original,omitempty"`
	// Answer is the regenerated answer, nil when the turn was not reached.
	Answer *Answer `json:"answer,omitempty"`
}

// Answer is one stored answer and how it was made.
type Answer struct {
	Content      string         `json:"content"`
	Reasoning    string         `json:"reasoning_content,omitempty"`
	ToolCalls    []llm.ToolCall `json:"tool_calls,omitempty"`
	Model        string         `json:"model,omitempty"`
	Lane         string         `json:"lane"`
	Attempts     int            `json:"attempts"`
	FinishReason string         `json:"finish_reason"`
	Usage        llm.Usage      `json:"usage"`
	Endpoint     string         `json:"endpoint,omitempty"`
	DurationMS   int64          `json:"duration_ms"`
	TTFTMS       int64          `json:"ttft_ms"`
	// Rejected marks the answer a quality rule refused (the last one of a
	// rejected sample).
	Rejected bool `json:"rejected,omitempty"`
}

// Of puts a stored row together. A body or answer that does not decode is
// an error naming the sample and the turn.
func Of(row store.Row) (Sample, error) {
	s := Sample{ID: row.ID, Partition: row.Partition, State: string(row.State), Lane: row.Lane, Attempts: row.Attempts,
		Origin: row.Origin, FinishedAt: row.FinishedAt}
	switch row.State {
	case store.Rejected:
		s.Rule, s.Evidence = row.Rule, row.Reason
	default:
		s.Error = row.Reason
	}
	p, err := conversation.Decode(row.Body)
	if err != nil {
		return s, fmt.Errorf("sample %s: %w", row.ID, err)
	}
	s.Tools, s.Planned, s.OriginalsKept = p.Tools, p.NumTurns(), p.Original != nil
	answers, err := answersOf(row)
	if err != nil {
		return s, err
	}
	for k := range p.NumTurns() {
		t := Turn{Turn: k, Input: p.Messages}
		if k > 0 {
			t.Input = p.Turns[k-1].Input
		}
		if k < len(p.Original) {
			t.Original = p.Original[k]
		}
		if a, ok := answers[k]; ok {
			t.Answer = &a
		}
		s.Turns = append(s.Turns, t)
	}
	if row.State == store.Done {
		s.EndedEarly = row.Result.EndReason
	}
	return s, nil
}

// answersOf decodes the row's stored answers by turn.
func answersOf(row store.Row) (map[int]Answer, error) {
	out := map[int]Answer{}
	for _, r := range row.Prior {
		a, err := answerOf(row.ID, r, r.Lane, r.Attempts)
		if err != nil {
			return nil, err
		}
		out[r.Turn] = a
	}
	if len(row.Result.Response) > 0 {
		a, err := answerOf(row.ID, row.Result, row.Lane, row.Attempts)
		if err != nil {
			return nil, err
		}
		a.Rejected = row.State == store.Rejected
		out[row.Result.Turn] = a
	}
	return out, nil
}

func answerOf(id string, r store.Result, lane string, attempts int) (Answer, error) {
	// reply.Decode takes what the record is silent about from the columns.
	res, err := reply.Decode(r)
	if err != nil {
		return Answer{}, fmt.Errorf("sample %s: decode stored answer to turn %d: %w", id, conversation.Ordinal(r.Turn), err)
	}
	return Answer{Content: res.Content, Reasoning: res.ReasoningContent, ToolCalls: res.ToolCalls, Model: res.Model,
		Lane: lane, Attempts: attempts, FinishReason: r.FinishReason, Usage: res.Usage, Endpoint: r.Endpoint,
		DurationMS: r.Duration.Milliseconds(), TTFTMS: r.TTFT.Milliseconds()}, nil
}
