package export

import (
	"fmt"
	"slices"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/llm"
)

// tokenSeq is a conversation as the server's token ids: the last turn's
// prompt ids followed by its completion ids, and 1 in LossMask exactly on
// the ids the model generated in this conversation's turns. Missing, when
// not empty, says why there are none ("unavailable: ...").
type tokenSeq struct {
	InputIDs []int32
	LossMask []int8
	Missing  string
}

// tokenSequence builds a record's token view from its answers, using only
// the ids and counts the server returned: turn k's completion sits in turn
// k+1's prompt at offset len(turn k's prompt ids), which holds when the
// chat template only appends (a later prompt starts with the earlier
// prompt and answer, id for id). Nothing is decoded or tokenized here; a
// conversation whose ids do not line up says so instead. engine names
// the server that answered a turn.
func tokenSequence(answers []llm.Result, engine func(turn int) string) tokenSeq {
	for k, a := range answers {
		switch {
		case a.TokenIDsUnavailable != "":
			return tokenSeq{Missing: "unavailable: " + a.TokenIDsUnavailable}
		case len(a.PromptTokenIDs) == 0 || len(a.CompletionTokenIDs) == 0:
			return tokenSeq{Missing: fmt.Sprintf("unavailable: %s (turn %d has no token ids)", engine(k), conversation.Ordinal(k))}
		case len(a.CompletionTokenIDs) != a.Usage.CompletionTokens:
			return tokenSeq{Missing: fmt.Sprintf("unavailable: turn %d has %d completion ids for %d completion tokens", conversation.Ordinal(k), len(a.CompletionTokenIDs), a.Usage.CompletionTokens)}
		}
	}
	type span struct{ from, to int }
	var spans []span
	for k, a := range answers {
		p, c := a.PromptTokenIDs, a.CompletionTokenIDs
		spans = append(spans, span{len(p), len(p) + len(c)})
		if k+1 == len(answers) {
			break
		}
		next := answers[k+1].PromptTokenIDs
		if len(next) < len(p)+len(c) || !slices.Equal(next[:len(p)], p) || !slices.Equal(next[len(p):len(p)+len(c)], c) {
			return tokenSeq{Missing: fmt.Sprintf("unavailable: turn %d's prompt does not start with turn %d's prompt and answer as generated (the history re-renders it, e.g. reasoning left out): output.token_rows: turn exports this conversation", conversation.Ordinal(k+1), conversation.Ordinal(k))}
		}
	}
	last := answers[len(answers)-1]
	ids := make([]int32, 0, len(last.PromptTokenIDs)+len(last.CompletionTokenIDs))
	ids = append(append(ids, last.PromptTokenIDs...), last.CompletionTokenIDs...)
	mask := make([]int8, len(ids))
	for _, s := range spans {
		for i := s.from; i < s.to; i++ {
			mask[i] = 1
		}
	}
	return tokenSeq{InputIDs: ids, LossMask: mask}
}

// tokens is the record's token view, built once for every writer.
func (r *record) tokens() tokenSeq {
	if r.toks == nil {
		t := tokenSequence(r.answers, r.engineOf)
		r.toks = &t
	}
	return *r.toks
}

// engineOf names the engine that answered turn k: the one its server
// reported when it answered (the stored provenance, which follows a
// detected engine), else the job's name for the endpoint, else the
// endpoint's URL when the job no longer lists it.
func (r *record) engineOf(k int) string {
	if k < len(r.provs) && r.provs[k].Engine != "" {
		return r.provs[k].Engine
	}
	url := r.row.Result.Endpoint
	if k < len(r.row.Prior) {
		url = r.row.Prior[k].Endpoint
	}
	if r.engineName != nil {
		if e := r.engineName(url); e != "" {
			return e
		}
	}
	return url
}

// countTokens adds a done record's training rows to the summary's
// token-id counts (rows are turns with Options.TokenRows turn).
func countTokens(sum *Summary, r *record) error {
	rows, err := r.rows()
	if err != nil {
		return err
	}
	for _, t := range rows {
		countRow(sum, t)
	}
	return nil
}

func countRow(sum *Summary, r *record) {
	if r.tokens().Missing == "" {
		sum.TokenIDs++
	} else {
		sum.TokenIDsUnavailable++
	}
}

// tokenFields are what Options.TokenIDs adds to a ShareGPT line whose ids
// are available; the line goes to the training file.
type tokenFields struct {
	InputIDs []int32 `json:"input_ids"`
	LossMask []int8  `json:"loss_mask"`
}

// missingTokens is what Options.TokenIDs adds to a ShareGPT line without
// ids ("unavailable: why"); the line goes to the no-token-ids file.
type missingTokens struct {
	TokenIDs string `json:"token_ids"`
}
