package stats

import (
	"cmp"
	"context"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// ReportVersion is the version of Report's JSON; it changes when a field
// changes meaning or goes away (adding fields does not change it).
const ReportVersion = 1

// Report is the statistics of one job's store.
type Report struct {
	Version int       `json:"version"`
	Job     string    `json:"job"`
	Time    time.Time `json:"time"`
	// Cells has one entry per partition and lane that has samples or
	// stored answers, sorted; Total sums them.
	Cells []Cell `json:"cells"`
	Total Cell   `json:"total"`
	// Rejects counts rejected samples per rule over the whole job.
	Rejects []RuleCount `json:"rejects,omitempty"`
	// Throughput is the tokens per second history over the job's span,
	// oldest first, in buckets of BucketSeconds chosen by AxisFor (a
	// second for a job of seconds, hours for one of weeks).
	Throughput    []Point    `json:"throughput,omitempty"`
	BucketSeconds int        `json:"bucket_seconds,omitempty"`
	Duplicates    Duplicates `json:"duplicates"`
	BadRows       int        `json:"bad_rows"` // source rows that never became samples
	// Generations are the job's configuration generations, oldest first:
	// the current one's answers are the ones counted here; older ones'
	// were superseded (kept in the store's history).
	Generations []store.Generation `json:"generations,omitempty"`
}

// Samples counts samples by state; a sample counts in the lane it is in now.
type Samples struct {
	Total    int `json:"total"`
	Pending  int `json:"pending"`
	InFlight int `json:"in_flight"`
	Done     int `json:"done"`
	Rejected int `json:"rejected"`
	Dead     int `json:"dead"`
}

// Cell is one partition and lane ("" in Total).
type Cell struct {
	Partition string  `json:"partition,omitempty"`
	Lane      string  `json:"lane,omitempty"`
	Samples   Samples `json:"samples"`
	// Answers are the stored answers generated in this lane: one per
	// finished turn (done, rejected, or continued to a next turn).
	Answers          int         `json:"answers"`
	PromptTokens     Percentiles `json:"prompt_tokens"`
	CompletionTokens Percentiles `json:"completion_tokens"`
	Truncated        int         `json:"truncated"` // answers with finish_reason length
	Rejected         int         `json:"rejected"`  // answers a quality rule refused
	EndedEarly       int         `json:"ended_early"`
	WithReasoning    int         `json:"with_reasoning"` // answers with reasoning tokens
	ReasoningTokens  int64       `json:"reasoning_tokens"`
	// TruncationRate and RejectRate are per answer; ReasoningShare is the
	// share of completion tokens spent on reasoning.
	TruncationRate float64 `json:"truncation_rate"`
	RejectRate     float64 `json:"reject_rate"`
	ReasoningShare float64 `json:"reasoning_share"`
}

// Percentiles are exact nearest-rank percentiles of a token count.
type Percentiles struct {
	P50  int   `json:"p50"`
	P90  int   `json:"p90"`
	P99  int   `json:"p99"`
	Max  int   `json:"max"`
	Mean int   `json:"mean"`
	Sum  int64 `json:"sum"`
}

// RuleCount is the rejected samples of one rule.
type RuleCount struct {
	Rule string `json:"rule"`
	N    int    `json:"n"`
}

// Point is one bucket of the throughput history.
type Point struct {
	Start            time.Time `json:"start"`
	Answers          int       `json:"answers"`
	CompletionPerSec float64   `json:"completion_tokens_per_s"`
	PromptPerSec     float64   `json:"prompt_tokens_per_s"`
	CompletionTokens int64     `json:"completion_tokens"`
	PromptTokens     int64     `json:"prompt_tokens"`
}

// Duplicates are source rows skipped because their id was already taken.
type Duplicates struct {
	Total       int               `json:"total"`
	SameContent int               `json:"same_content"`
	Examples    []store.Duplicate `json:"examples,omitempty"`
}

// Store is what the statistics read: the headline numbers and the
// dataset's sums, both kept with every stored answer.
type Store interface {
	store.Progress
	store.Statistics
}

// Compute reads the statistics of st. now stamps the report.
func Compute(ctx context.Context, st Store, jobName string, now time.Time) (Report, error) {
	r := Report{Version: ReportVersion, Job: jobName, Time: now}
	cells := map[[2]string]*Cell{}
	cell := func(p, l string) *Cell {
		k := [2]string{p, l}
		if cells[k] == nil {
			cells[k] = &Cell{Partition: p, Lane: l}
		}
		return cells[k]
	}
	counts, err := st.Counts(ctx)
	if err != nil {
		return r, err
	}
	for _, c := range counts {
		addSamples(&cell(c.Partition, c.Lane).Samples, c.State, c.N)
		addSamples(&r.Total.Samples, c.State, c.N)
	}
	sc, err := st.StatCells(ctx)
	if err != nil {
		return r, err
	}
	for _, s := range sc {
		addCell(cell(s.Partition, s.Lane), &r.Total, s)
	}
	if err := percentiles(ctx, st, cell, &r.Total); err != nil {
		return r, err
	}
	if r.Generations, err = st.Generations(ctx); err != nil {
		return r, err
	}
	for _, c := range cells {
		finish(c)
		r.Cells = append(r.Cells, *c)
	}
	finish(&r.Total)
	slices.SortFunc(r.Cells, func(a, b Cell) int {
		return cmp.Or(strings.Compare(a.Partition, b.Partition), strings.Compare(a.Lane, b.Lane))
	})

	rc, err := st.RejectCounts(ctx)
	if err != nil {
		return r, err
	}
	r.Rejects = byRule(rc)

	var bucket time.Duration
	if r.Throughput, bucket, err = history(ctx, st, now); err != nil {
		return r, err
	}
	r.BucketSeconds = int(bucket / time.Second)

	d, err := st.IngestDuplicates(ctx, 5)
	if err != nil {
		return r, err
	}
	r.Duplicates = Duplicates{Total: d.Total, SameContent: d.SameContent, Examples: d.Examples}
	if r.BadRows, err = st.IngestErrorCount(ctx); err != nil {
		return r, err
	}
	return r, nil
}

// addCell puts a stored cell's sums in its report cell and the total.
func addCell(c, t *Cell, s store.StatCell) {
	c.Answers, c.Truncated, c.Rejected, c.EndedEarly = s.Requests, s.Truncated, s.Rejected, s.Ended
	c.WithReasoning, c.ReasoningTokens = s.WithReasoning, s.ReasoningTokens
	c.PromptTokens.Sum, c.CompletionTokens.Sum = s.PromptTokens, s.CompletionTokens
	t.Answers += s.Requests
	t.Truncated += s.Truncated
	t.Rejected += s.Rejected
	t.EndedEarly += s.Ended
	t.WithReasoning += s.WithReasoning
	t.ReasoningTokens += s.ReasoningTokens
	t.PromptTokens.Sum += s.PromptTokens
	t.CompletionTokens.Sum += s.CompletionTokens
}

// byRule sums the rejects per rule, the most frequent first.
func byRule(rc []store.RejectCount) []RuleCount {
	n := map[string]int{}
	for _, c := range rc {
		n[c.Rule] += c.N
	}
	var out []RuleCount
	for rule, k := range n {
		out = append(out, RuleCount{Rule: rule, N: k})
	}
	slices.SortFunc(out, func(a, b RuleCount) int { return cmp.Or(cmp.Compare(b.N, a.N), strings.Compare(a.Rule, b.Rule)) })
	return out
}

func addSamples(s *Samples, st store.State, n int) {
	s.Total += n
	switch st {
	case store.Pending:
		s.Pending += n
	case store.Leased:
		s.InFlight += n
	case store.Done:
		s.Done += n
	case store.Rejected:
		s.Rejected += n
	case store.Dead:
		s.Dead += n
	}
}

// ranker turns a stream of (value, count) in value order, whose total is
// known, into nearest-rank percentiles.
type ranker struct {
	total, seen int
	out         *Percentiles
}

func newRanker(total int, out *Percentiles) *ranker { return &ranker{total: total, out: out} }

func (k *ranker) add(value, n int) {
	before := k.seen
	k.seen += n
	for _, q := range []struct {
		p   float64
		dst *int
	}{{0.5, &k.out.P50}, {0.9, &k.out.P90}, {0.99, &k.out.P99}} {
		rank := int(math.Ceil(q.p * float64(k.total)))
		if before < rank && k.seen >= rank {
			*q.dst = value
		}
	}
	k.out.Max = value
}

// percentiles streams the token histograms once: each cell's rows arrive
// together and in token order, so its percentiles need no memory; the
// job-wide ones keep one count per distinct token value.
func percentiles(ctx context.Context, st Store, cell func(p, l string) *Cell, total *Cell) error {
	all := map[string]map[int]int{store.PromptKind: {}, store.CompletionKind: {}}
	var cur *ranker
	var key [3]string
	err := st.EachTokenCount(ctx, func(tc store.TokenCount) error {
		k := [3]string{tc.Partition, tc.Lane, tc.Kind}
		if cur == nil || k != key {
			c := cell(tc.Partition, tc.Lane)
			dst := &c.CompletionTokens
			if tc.Kind == store.PromptKind {
				dst = &c.PromptTokens
			}
			cur, key = newRanker(c.Answers, dst), k
		}
		cur.add(tc.Tokens, tc.N)
		all[tc.Kind][tc.Tokens] += tc.N
		return nil
	})
	if err != nil {
		return err
	}
	for kind, m := range all {
		dst := &total.CompletionTokens
		if kind == store.PromptKind {
			dst = &total.PromptTokens
		}
		values := make([]int, 0, len(m))
		for v := range m {
			values = append(values, v)
		}
		slices.Sort(values)
		k := newRanker(total.Answers, dst)
		for _, v := range values {
			k.add(v, m[v])
		}
	}
	return nil
}

// finish fills a cell's means and rates.
func finish(c *Cell) {
	if c.Answers == 0 {
		return
	}
	n := float64(c.Answers)
	c.PromptTokens.Mean = int(math.Round(float64(c.PromptTokens.Sum) / n))
	c.CompletionTokens.Mean = int(math.Round(float64(c.CompletionTokens.Sum) / n))
	c.TruncationRate = float64(c.Truncated) / n
	c.RejectRate = float64(c.Rejected) / n
	if c.CompletionTokens.Sum > 0 {
		c.ReasoningShare = float64(c.ReasoningTokens) / float64(c.CompletionTokens.Sum)
	}
}

// history is the throughput series over the job's span, cut by the one
// rule AxisFor: a job of under an hour is read from its answers in
// buckets down to a second; a longer one folds the per-minute aggregate.
// Empty buckets are kept (a stall shows); now bounds the last one's rate.
func history(ctx context.Context, st Store, now time.Time) ([]Point, time.Duration, error) {
	mins, err := st.ThroughputHistory(ctx)
	if err != nil || len(mins) == 0 {
		return nil, 0, err
	}
	first, last := mins[0].Minute, mins[len(mins)-1].Minute.Add(time.Minute-time.Nanosecond)
	a := AxisFor(first, last, time.Minute)
	if a.Bucket <= time.Minute { // an hour or less: minutes are too coarse
		tp, err := st.ThroughputSince(ctx, first)
		if err != nil {
			return nil, 0, err
		}
		if !tp.First.IsZero() {
			a = AxisFor(tp.First, tp.Last, time.Second)
			if mins, err = st.ThroughputBuckets(ctx, a.Start, a.Bucket); err != nil {
				return nil, 0, err
			}
		}
	}
	return fold(mins, a, now), a.Bucket, nil
}

// fold sums the stored answers into the axis' buckets, rates per bucket.
func fold(mins []store.MinuteThroughput, a Axis, now time.Time) []Point {
	points := make([]Point, a.Buckets)
	for i := range points {
		points[i].Start = a.Start.Add(time.Duration(i) * a.Bucket)
	}
	for _, m := range mins {
		if i := a.Index(m.Minute); i >= 0 {
			p := &points[i]
			p.Answers += m.Requests
			p.CompletionTokens += m.CompletionTokens
			p.PromptTokens += m.PromptTokens
		}
	}
	for i := range points {
		p := &points[i]
		p.CompletionPerSec = a.PerSecond(float64(p.CompletionTokens), i, now)
		p.PromptPerSec = a.PerSecond(float64(p.PromptTokens), i, now)
	}
	return points
}
