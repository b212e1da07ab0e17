package web

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"time"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/review"
	"github.com/regen-dev/regen/internal/store"
)

// sampleRow is one sample as the dashboard shows it.
type sampleRow struct {
	ID        string `json:"id"`
	Partition string `json:"partition"`
	Lane      string `json:"lane"`
	State     string `json:"state"`
	Attempts  int    `json:"attempts"`
	Origin    string `json:"origin"`
	// Reason is a reject's evidence (Rule the rule) or the last error.
	Reason string `json:"reason,omitempty"`
	Rule   string `json:"rule,omitempty"`
	answer
	FinishedAt time.Time `json:"finished_at,omitzero"`
	// Request is the stored body (the turn plan's messages, tools and later
	// turns' inputs), Response the last answer, Prior the answers to the
	// earlier turns; set only for a single sample.
	Request  json.RawMessage `json:"request,omitempty"`
	Response json.RawMessage `json:"response,omitempty"`
	Prior    []turnAnswer    `json:"prior,omitempty"`
	// Review is the sample turn by turn (package review), as `regen show
	// --json` prints it; ReviewError says why it could not be put together.
	Review      *review.Sample `json:"review,omitempty"`
	ReviewError string         `json:"review_error,omitempty"`
}

// answer is the numbers of one stored answer.
type answer struct {
	Turn             int    `json:"turn"` // 0-based index; shown as turn Turn+1 (conversation.Ordinal)
	FinishReason     string `json:"finish_reason,omitempty"`
	EndReason        string `json:"end_reason,omitempty"` // why the conversation ended before its last planned turn
	PromptTokens     int    `json:"prompt_tokens,omitempty"`
	CompletionTokens int    `json:"completion_tokens,omitempty"`
	ReasoningTokens  int    `json:"reasoning_tokens,omitempty"`
	Endpoint         string `json:"endpoint,omitempty"`
	DurationMS       int64  `json:"duration_ms,omitempty"`
	TTFTMS           int64  `json:"ttft_ms,omitempty"`
}

// turnAnswer is the stored answer to an earlier turn of a sample.
type turnAnswer struct {
	answer
	Lane     string          `json:"lane"`
	Attempts int             `json:"attempts"`
	Response json.RawMessage `json:"response,omitempty"`
}

func answerOf(r store.Result) answer {
	return answer{Turn: r.Turn, FinishReason: r.FinishReason, EndReason: r.EndReason, PromptTokens: r.PromptTokens,
		CompletionTokens: r.CompletionTokens, ReasoningTokens: r.ReasoningTokens, Endpoint: r.Endpoint,
		DurationMS: r.Duration.Milliseconds(), TTFTMS: r.TTFT.Milliseconds()}
}

func rowOf(r store.Row) sampleRow {
	return sampleRow{ID: r.ID, Partition: r.Partition, Lane: r.Lane, State: string(r.State), Attempts: r.Attempts,
		Origin: r.Origin, Reason: r.Reason, Rule: r.Rule, answer: answerOf(r.Result), FinishedAt: r.FinishedAt}
}

// rawJSON passes stored JSON through, or quotes it as a string when it is
// not JSON (so the page shows it instead of the answer failing).
func rawJSON(b []byte) json.RawMessage {
	if len(b) == 0 {
		return nil
	}
	if json.Valid(b) {
		return b
	}
	q, _ := json.Marshal(string(b))
	return q
}

func (s *Server) sample(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	row, ok, err := s.o.Store.Sample(r.Context(), id)
	if err != nil {
		s.fail(w, "sample", err)
		return
	}
	if !ok {
		http.Error(w, "no sample with id "+id, http.StatusNotFound)
		return
	}
	row.Origin = job.RelTo(s.o.JobDir, row.Origin)
	out := rowOf(row)
	out.Request, out.Response = rawJSON(row.Body), rawJSON(row.Result.Response)
	for _, p := range row.Prior {
		out.Prior = append(out.Prior, turnAnswer{answer: answerOf(p), Lane: p.Lane, Attempts: p.Attempts, Response: rawJSON(p.Response)})
	}
	if rv, err := review.Of(row); err != nil {
		out.ReviewError = err.Error()
	} else {
		out.Review = &rv
	}
	writeJSON(w, out)
}

// maxScan bounds the rows one filtered listing reads; a page that ran out
// of it has fewer rows than asked and a next cursor to go on from.
const maxScan = 20 * maxPage

// rowFilter is what the samples listing filters on beyond the store's
// query (state and partition).
type rowFilter struct {
	rule, lane string
	ended      bool // done conversations that ended before their last planned turn
	generation int  // the configuration generation of the last answer; 0: any
}

func (f rowFilter) none() bool { return f == rowFilter{} }

func (f rowFilter) match(r store.Row) bool {
	return (f.rule == "" || r.Rule == f.rule) && (f.lane == "" || r.Lane == f.lane) &&
		(!f.ended || (r.State == store.Done && r.Result.EndReason != "")) &&
		(f.generation == 0 || r.Result.FinishReason != "" && r.Result.Generation == f.generation)
}

// filtered reads pages from the store after q.After until limit+1 rows
// match or maxScan rows were read. next is where to go on: "" at the end.
func (s *Server) filtered(ctx context.Context, q store.SampleQuery, f rowFilter, limit int) (rows []store.Row, next string, err error) {
	scanned := 0
	for scanned < maxScan {
		q.Limit = maxPage
		page, err := s.o.Store.Samples(ctx, q)
		if err != nil {
			return nil, "", err
		}
		for _, r := range page {
			scanned++
			q.After = r.ID
			if !f.match(r) {
				continue
			}
			rows = append(rows, r)
			if len(rows) > limit {
				return rows[:limit], rows[limit-1].ID, nil
			}
		}
		if len(page) < maxPage {
			return rows, "", nil
		}
	}
	return rows, q.After, nil
}

func (s *Server) samples(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	query := store.SampleQuery{Partition: q.Get("partition"), State: store.State(q.Get("state")), After: q.Get("after")}
	switch query.State {
	case "", store.Pending, store.Leased, store.Done, store.Rejected, store.Dead:
	default:
		http.Error(w, "state must be pending, leased, done, rejected or dead", http.StatusBadRequest)
		return
	}
	limit, err := intParam(r, "limit", 50, 1, maxPage)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f := rowFilter{rule: q.Get("rule"), lane: q.Get("lane")}
	if f.generation, err = intParam(r, "generation", 0, 1, math.MaxInt32); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	switch q.Get("ended") {
	case "", "0", "false":
	case "1", "true":
		f.ended = true
	default:
		http.Error(w, "ended must be true or false", http.StatusBadRequest)
		return
	}
	page := struct {
		Rows []sampleRow `json:"rows"`
		Next string      `json:"next,omitempty"` // pass as after= for the next page
	}{Rows: []sampleRow{}}
	var rows []store.Row
	if f.none() {
		// One more than asked tells whether a next page exists.
		query.Limit = limit + 1
		rows, err = s.o.Store.Samples(r.Context(), query)
		if len(rows) > limit {
			rows, page.Next = rows[:limit], rows[limit-1].ID
		}
	} else {
		rows, page.Next, err = s.filtered(r.Context(), query, f, limit)
	}
	if err != nil {
		s.fail(w, "samples", err)
		return
	}
	for _, row := range rows {
		row.Origin = job.RelTo(s.o.JobDir, row.Origin)
		page.Rows = append(page.Rows, rowOf(row))
	}
	writeJSON(w, page)
}

// stream pushes the status report every period as server-sent events, so
// the page updates without polling; it ends when the client goes away.
func (s *Server) stream(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{})
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	t := time.NewTicker(s.o.Every)
	defer t.Stop()
	for {
		rep, err := s.o.Report(r.Context())
		if r.Context().Err() != nil {
			return
		}
		var b []byte
		if err != nil {
			b, _ = json.Marshal(map[string]string{"error": err.Error()})
		} else {
			b, _ = json.Marshal(rep)
		}
		if _, err := w.Write([]byte("event: status\ndata: " + string(b) + "\n\n")); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-t.C:
		}
	}
}
