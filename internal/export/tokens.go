package export

import (
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/tokenrows"
)

// tokenSeq is a row's token ids (package tokenrows builds them for
// export and capture alike).
type tokenSeq = tokenrows.Seq

// tokenSequence is a conversation's row (tokenrows.Conversation).
func tokenSequence(answers []llm.Result, engine func(turn int) string) tokenSeq {
	return tokenrows.Conversation(answers, engine)
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
