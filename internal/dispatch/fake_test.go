package dispatch

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// fakeStore is an in-memory store.Store with the same state machine as the
// real backends: leases with owners and expiry, attempts, not_before.
type fakeStore struct {
	mu      sync.Mutex
	seq     int
	samples map[string]*fakeSample
	ierrs   []store.IngestError
	hbs     map[string]store.Heartbeat // by owner
	events  []store.Event
	locks   map[string]bool
	files   map[[2]string]store.SourceFile
	minutes map[minuteKey]store.Minute

	// hook, when set, runs before every transition; a non-nil error fails it.
	hook func(op, id string) error
	// transitions counts every successful final transition (done, dead) per id.
	finals map[string]int
	// claims counts Claim calls, releases Release'd samples.
	claims, released int
	// answers logs every stored answer, for the statistics.
	answers []fakeAnswer
	dups    map[string]store.Duplicate // by origin
	gens    []store.Generation
	// tokens numbers the leases, as a shared store's fencing tokens do.
	tokens int64
}

// fakeAnswer is one stored answer; gone once its reject was requeued.
type fakeAnswer struct {
	partition, lane, rule string
	r                     store.Result
	at                    time.Time
	gone                  bool
}

type fakeSample struct {
	store.NewSample
	seq        int
	state      store.State
	owner      string
	leaseUntil time.Time
	token      int64 // the current lease's fencing token
	notBefore  time.Time
	attempts   int
	lastErr    string
	errAt      time.Time
	result     store.Result
	reason     string
	rule       string
	finishedAt time.Time
	turn       int
	prior      []store.Result
	answer     int // index in fakeStore.answers of the final answer
}

func newFakeStore() *fakeStore {
	return &fakeStore{samples: map[string]*fakeSample{}, finals: map[string]int{}, dups: map[string]store.Duplicate{},
		hbs: map[string]store.Heartbeat{}, locks: map[string]bool{}, files: map[[2]string]store.SourceFile{}}
}

var _ store.Store = (*fakeStore)(nil)

// add ingests n samples named prefix-i into lane.
func (s *fakeStore) add(lane, prefix string, n int) {
	var ns []store.NewSample
	for i := range n {
		id := fmt.Sprintf("%s-%05d", prefix, i)
		ns = append(ns, store.NewSample{ID: id, Partition: "p", Lane: lane, Body: []byte(`{"messages":[{"role":"user","content":"` + id + `"}]}`)})
	}
	if _, err := s.Ingest(context.Background(), ns); err != nil {
		panic(err)
	}
}

func (s *fakeStore) get(id string) fakeSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return *s.samples[id]
}

func (s *fakeStore) states() map[store.State]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := map[store.State]int{}
	for _, x := range s.samples {
		m[x.state]++
	}
	return m
}

func (s *fakeStore) Ingest(_ context.Context, samples []store.NewSample) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, x := range samples {
		if first, ok := s.samples[x.ID]; ok {
			if _, seen := s.dups[x.Origin]; !seen && first.Origin != x.Origin {
				s.dups[x.Origin] = store.Duplicate{ID: x.ID, Partition: x.Partition, Origin: x.Origin,
					FirstOrigin: first.Origin, SameContent: string(first.Body) == string(x.Body)}
			}
			continue
		}
		s.seq++
		s.samples[x.ID] = &fakeSample{NewSample: x, seq: s.seq, state: store.Pending}
		n++
	}
	return n, nil
}

func (s *fakeStore) AddIngestErrors(_ context.Context, errs []store.IngestError) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range errs {
		if !slices.ContainsFunc(s.ierrs, func(x store.IngestError) bool { return x.Origin == e.Origin }) {
			s.ierrs = append(s.ierrs, e)
		}
	}
	return nil
}

func (s *fakeStore) IngestErrors(_ context.Context, limit int) ([]store.IngestError, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ierrs[:upTo(limit, len(s.ierrs))]), nil
}

func (s *fakeStore) IngestErrorCount(context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ierrs), nil
}

func (s *fakeStore) EachIngestError(_ context.Context, fn func(store.IngestError) error) error {
	s.mu.Lock()
	errs := slices.Clone(s.ierrs) // in the order first recorded
	s.mu.Unlock()
	for _, e := range errs {
		if err := fn(e); err != nil {
			return err
		}
	}
	return nil
}

func (s *fakeStore) Claim(_ context.Context, lane string, n int, owner string, lease time.Duration) ([]store.Claimed, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.claims++
	if err := s.hookLocked("claim", lane); err != nil {
		return nil, err
	}
	now := time.Now()
	var ready []*fakeSample
	for _, x := range s.samples {
		if x.state == store.Pending && x.Lane == lane && !now.Before(x.notBefore) {
			ready = append(ready, x)
		}
	}
	slices.SortFunc(ready, func(a, b *fakeSample) int { return store.CompareClaims(a.turn, int64(a.seq), b.turn, int64(b.seq)) })
	var out []store.Claimed
	for _, x := range ready[:min(n, len(ready))] {
		s.tokens++
		x.state, x.owner, x.leaseUntil, x.token = store.Leased, owner, now.Add(lease), s.tokens
		out = append(out, store.Claimed{ID: x.ID, Partition: x.Partition, Lane: x.Lane, Body: x.Body, Token: x.token,
			PromptTokens: x.PromptTokens, Attempts: x.attempts, LeaseUntil: x.leaseUntil, Turn: x.turn, Prior: slices.Clone(x.prior)})
	}
	return out, nil
}

func (s *fakeStore) ExtendLeases(_ context.Context, owner string, lease time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	until := time.Now().Add(lease)
	for _, x := range s.samples {
		if x.state == store.Leased && x.owner == owner {
			x.leaseUntil = until
		}
	}
	return nil
}

// Commit runs a transition through the named methods, refused first when
// its token is not the held lease's (the token is read under the lock the
// method takes again; the dispatcher never commits one sample twice at
// once, so nothing moves in between).
func (s *fakeStore) Commit(ctx context.Context, t store.Transition) error {
	s.mu.Lock()
	x, ok := s.samples[t.ID]
	stale := t.Token != 0 && ok && x.state == store.Leased && x.token != t.Token
	s.mu.Unlock()
	if stale {
		return store.ErrNotLeased
	}
	switch t.Op {
	case store.OpFinish:
		if t.State == store.Rejected {
			return s.Reject(ctx, t.ID, t.Owner, t.Result, t.Rule, t.Evidence)
		}
		return s.Complete(ctx, t.ID, t.Owner, t.Result)
	case store.OpTurn:
		return s.CompleteTurn(ctx, t.ID, t.Owner, t.Result, t.Lane)
	case store.OpRetry:
		return s.Retry(ctx, t.ID, t.Owner, t.NotBefore, t.LastError)
	case store.OpDead:
		return s.DeadLetter(ctx, t.ID, t.Owner, t.Reason)
	case store.OpEscalate:
		return s.Escalate(ctx, t.ID, t.Owner, t.Lane)
	case store.OpRelane:
		return s.Relane(ctx, t.ID, t.Owner, t.Lane)
	}
	return fmt.Errorf("unknown transition %d", t.Op)
}

func (s *fakeStore) hookLocked(op, id string) error {
	if s.hook == nil {
		return nil
	}
	return s.hook(op, id)
}

// leased returns the sample if owner holds its lease, after running the hook.
func (s *fakeStore) leased(op, id, owner string) (*fakeSample, error) {
	if err := s.hookLocked(op, id); err != nil {
		return nil, err
	}
	x, ok := s.samples[id]
	if !ok || x.state != store.Leased || x.owner != owner {
		return nil, store.ErrNotLeased
	}
	return x, nil
}

// leasedAt is leased for a result that must answer the sample's current turn.
func (s *fakeStore) leasedAt(op, id, owner string, turn int) (*fakeSample, error) {
	x, err := s.leased(op, id, owner)
	if err == nil && x.turn != turn {
		return nil, fmt.Errorf("%w: the sample is at turn %d", store.ErrWrongTurn, x.turn)
	}
	return x, err
}

func (s *fakeStore) addAnswer(x *fakeSample, r store.Result, rule string) int {
	s.answers = append(s.answers, fakeAnswer{partition: x.Partition, lane: x.Lane, rule: rule, r: r, at: time.Now()})
	return len(s.answers) - 1
}

func (s *fakeStore) CompleteTurn(_ context.Context, id, owner string, r store.Result, nextLane string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	x, err := s.leasedAt("turn", id, owner, r.Turn)
	if err != nil {
		return err
	}
	s.addAnswer(x, r, "")
	r.Lane, r.Attempts = x.Lane, x.attempts+1
	x.prior = append(x.prior, r)
	x.turn++
	x.state, x.owner, x.attempts, x.notBefore = store.Pending, "", 0, time.Time{}
	if nextLane != "" {
		x.Lane = nextLane
	}
	return nil
}

func (s *fakeStore) RequeueRejected(_ context.Context, rule string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, x := range s.samples {
		if x.state != store.Rejected || (rule != "" && x.rule != rule) {
			continue
		}
		s.answers[x.answer].gone = true
		x.state, x.attempts, x.notBefore, x.finishedAt = store.Pending, 0, time.Time{}, time.Time{}
		x.result, x.reason, x.rule = store.Result{}, "", ""
		n++
	}
	return n, nil
}

func (s *fakeStore) RejectCounts(context.Context) ([]store.RejectCount, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := map[store.RejectCount]int{}
	for _, x := range s.samples {
		if x.state == store.Rejected {
			m[store.RejectCount{Partition: x.Partition, Lane: s.answers[x.answer].lane, Rule: x.rule}]++
		}
	}
	var out []store.RejectCount
	for k, n := range m {
		k.N = n
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b store.RejectCount) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Lane, b.Lane), cmp.Compare(a.Rule, b.Rule))
	})
	return out, nil
}

func (s *fakeStore) StatCells(context.Context) ([]store.StatCell, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := map[[2]string]*store.StatCell{}
	for _, a := range s.answers {
		if a.gone {
			continue
		}
		c := m[[2]string{a.partition, a.lane}]
		if c == nil {
			c = &store.StatCell{Partition: a.partition, Lane: a.lane}
			m[[2]string{a.partition, a.lane}] = c
		}
		c.Requests++
		if a.r.FinishReason == "length" {
			c.Truncated++
		}
		if a.rule != "" {
			c.Rejected++
		}
		if a.r.ReasoningTokens > 0 {
			c.WithReasoning++
		}
		if a.r.EndReason != "" {
			c.Ended++
		}
		c.PromptTokens += int64(a.r.PromptTokens)
		c.CompletionTokens += int64(a.r.CompletionTokens)
		c.ReasoningTokens += int64(a.r.ReasoningTokens)
	}
	var out []store.StatCell
	for _, c := range m {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b store.StatCell) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Lane, b.Lane))
	})
	return out, nil
}

func (s *fakeStore) EachTokenCount(_ context.Context, fn func(store.TokenCount) error) error {
	s.mu.Lock()
	m := map[store.TokenCount]int{}
	for _, a := range s.answers {
		if a.gone {
			continue
		}
		m[store.TokenCount{Partition: a.partition, Lane: a.lane, Kind: store.PromptKind, Tokens: a.r.PromptTokens}]++
		m[store.TokenCount{Partition: a.partition, Lane: a.lane, Kind: store.CompletionKind, Tokens: a.r.CompletionTokens}]++
	}
	s.mu.Unlock()
	var out []store.TokenCount
	for k, n := range m {
		k.N = n
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b store.TokenCount) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Lane, b.Lane), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Tokens, b.Tokens))
	})
	for _, c := range out {
		if err := fn(c); err != nil {
			return err
		}
	}
	return nil
}

func (s *fakeStore) ThroughputHistory(ctx context.Context) ([]store.MinuteThroughput, error) {
	return s.ThroughputBuckets(ctx, time.Unix(0, 0), time.Minute)
}

func (s *fakeStore) ThroughputBuckets(_ context.Context, start time.Time, w time.Duration) ([]store.MinuteThroughput, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := map[int64]*store.MinuteThroughput{}
	for _, a := range s.answers {
		if a.at.Before(start) {
			continue
		}
		b := int64(a.at.Sub(start) / w)
		t := m[b]
		if t == nil {
			t = &store.MinuteThroughput{Minute: start.Add(time.Duration(b) * w)}
			m[b] = t
		}
		t.Requests++
		t.PromptTokens += int64(a.r.PromptTokens)
		t.CompletionTokens += int64(a.r.CompletionTokens)
	}
	var out []store.MinuteThroughput
	for _, t := range m {
		out = append(out, *t)
	}
	slices.SortFunc(out, func(a, b store.MinuteThroughput) int { return a.Minute.Compare(b.Minute) })
	return out, nil
}

func (s *fakeStore) IngestDuplicates(_ context.Context, limit int) (store.Duplicates, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var d store.Duplicates
	for _, x := range s.dups {
		d.Total++
		if x.SameContent {
			d.SameContent++
		}
		d.Examples = append(d.Examples, x)
	}
	slices.SortFunc(d.Examples, func(a, b store.Duplicate) int { return cmp.Compare(a.Origin, b.Origin) })
	d.Examples = d.Examples[:upTo(limit, len(d.Examples))]
	if len(d.Examples) == 0 {
		d.Examples = nil
	}
	return d, nil
}

func (s *fakeStore) finish(x *fakeSample, st store.State) {
	x.state, x.owner, x.finishedAt = st, "", time.Now()
	s.finals[x.ID]++
}

func (s *fakeStore) Complete(_ context.Context, id, owner string, r store.Result) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	x, err := s.leasedAt("complete", id, owner, r.Turn)
	if err != nil {
		return err
	}
	x.result = r
	x.answer = s.addAnswer(x, r, "")
	x.attempts++
	s.finish(x, store.Done)
	return nil
}

func (s *fakeStore) Reject(_ context.Context, id, owner string, r store.Result, rule, evidence string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	x, err := s.leasedAt("reject", id, owner, r.Turn)
	if err != nil {
		return err
	}
	x.result, x.reason, x.rule = r, evidence, rule
	x.answer = s.addAnswer(x, r, rule)
	x.attempts++
	s.finish(x, store.Rejected)
	return nil
}

func (s *fakeStore) Retry(_ context.Context, id, owner string, notBefore time.Time, lastErr string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	x, err := s.leased("retry", id, owner)
	if err != nil {
		return err
	}
	x.state, x.owner, x.notBefore, x.lastErr, x.errAt = store.Pending, "", notBefore, lastErr, time.Now()
	x.attempts++
	return nil
}

func (s *fakeStore) Release(_ context.Context, ids []string, owner string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if err := s.hookLocked("release", id); err != nil {
			return err
		}
		x, ok := s.samples[id]
		if !ok || x.state != store.Leased || x.owner != owner {
			continue // releasing what is no longer ours is a no-op
		}
		x.state, x.owner = store.Pending, ""
		s.released++
	}
	return nil
}

func (s *fakeStore) ReleaseOwner(_ context.Context, owner string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, x := range s.samples {
		if x.state == store.Leased && x.owner == owner {
			x.state, x.owner = store.Pending, ""
			n++
		}
	}
	return n, nil
}

func (s *fakeStore) ReleaseOwnerExcept(_ context.Context, owner string, keep []string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, x := range s.samples {
		if x.state == store.Leased && x.owner == owner && !slices.Contains(keep, x.ID) {
			x.state, x.owner = store.Pending, ""
			n++
		}
	}
	return n, nil
}

func (s *fakeStore) DeadLetter(_ context.Context, id, owner, reason string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	x, err := s.leased("dead", id, owner)
	if err != nil {
		return err
	}
	x.attempts++
	x.reason, x.lastErr, x.errAt = reason, reason, time.Now()
	s.finish(x, store.Dead)
	return nil
}

func (s *fakeStore) RequeueDead(_ context.Context, reasonContains string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, x := range s.samples {
		if x.state != store.Dead || !strings.Contains(x.lastErr, reasonContains) {
			continue
		}
		x.state, x.attempts, x.notBefore = store.Pending, 0, time.Time{}
		x.lastErr, x.errAt, x.reason, x.finishedAt = "", time.Time{}, "", time.Time{}
		n++
	}
	return n, nil
}

func (s *fakeStore) Escalate(_ context.Context, id, owner, lane string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	x, err := s.leased("escalate", id, owner)
	if err != nil {
		return err
	}
	x.state, x.owner, x.Lane, x.notBefore = store.Pending, "", lane, time.Time{}
	return nil
}

func (s *fakeStore) Relane(_ context.Context, id, owner, lane string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	x, err := s.leased("relane", id, owner)
	if err != nil {
		return err
	}
	x.Lane = lane
	return nil
}

func (s *fakeStore) ExpireLeases(_ context.Context, now time.Time) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, x := range s.samples {
		if x.state == store.Leased && x.leaseUntil.Before(now) {
			x.state, x.owner = store.Pending, ""
			n++
		}
	}
	return n, nil
}

func (s *fakeStore) Counts(context.Context) ([]store.Count, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	type key struct {
		p, l string
		st   store.State
	}
	m := map[key]int{}
	for _, x := range s.samples {
		m[key{x.Partition, x.Lane, x.state}]++
	}
	var out []store.Count
	for k, n := range m {
		out = append(out, store.Count{Partition: k.p, Lane: k.l, State: k.st, N: n})
	}
	slices.SortFunc(out, func(a, b store.Count) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Lane, b.Lane), cmp.Compare(a.State, b.State))
	})
	return out, nil
}

func (s *fakeStore) ThroughputSince(_ context.Context, t time.Time) (store.Throughput, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var tp store.Throughput
	for _, x := range s.samples {
		if (x.state == store.Done || x.state == store.Rejected) && !x.finishedAt.Before(t) {
			tp.Samples++
		}
	}
	for _, a := range s.answers {
		if !a.at.Before(t) && !a.gone { // a requeued reject's answer is dropped, as in SQLite
			tp.CompletionTokens += int64(a.r.CompletionTokens)
			tp.PromptTokens += int64(a.r.PromptTokens)
			if tp.First.IsZero() || a.at.Before(tp.First) {
				tp.First = a.at
			}
			if a.at.After(tp.Last) {
				tp.Last = a.at
			}
		}
	}
	return tp, nil
}

func (s *fakeStore) rows(keep func(*fakeSample) bool) []store.Row {
	var rows []store.Row
	for _, x := range s.samples {
		if keep(x) {
			r := store.Row{ID: x.ID, Partition: x.Partition, Lane: x.Lane, State: x.state, Body: x.Body,
				Attempts: x.attempts, Result: x.result, Reason: x.reason, Rule: x.rule, FinishedAt: x.finishedAt}
			if x.state != store.Dead {
				r.Prior = slices.Clone(x.prior)
			}
			rows = append(rows, r)
		}
	}
	return rows
}

func (s *fakeStore) Finished(_ context.Context, fn func(store.Row) error) error {
	s.mu.Lock()
	rows := s.rows(func(x *fakeSample) bool {
		return x.state == store.Done || x.state == store.Rejected || x.state == store.Dead
	})
	for i := range rows {
		rows[i].Origin = s.samples[rows[i].ID].Origin // Finished carries the row's origin, as the backends do
	}
	s.mu.Unlock()
	slices.SortFunc(rows, func(a, b store.Row) int { return cmp.Compare(a.ID, b.ID) })
	for _, r := range rows {
		if err := fn(r); err != nil {
			return err
		}
	}
	return nil
}

func (s *fakeStore) LastErrors(_ context.Context, limit int) ([]store.Row, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var xs []*fakeSample
	for _, x := range s.samples {
		if !x.errAt.IsZero() {
			xs = append(xs, x)
		}
	}
	slices.SortFunc(xs, func(a, b *fakeSample) int { return cmp.Or(b.errAt.Compare(a.errAt), cmp.Compare(b.seq, a.seq)) })
	var rows []store.Row
	for _, x := range xs[:upTo(limit, len(xs))] {
		rows = append(rows, store.Row{ID: x.ID, Partition: x.Partition, Lane: x.Lane, State: x.state, Body: x.Body,
			Attempts: x.attempts, Reason: x.lastErr, FinishedAt: x.finishedAt})
	}
	return rows, nil
}

func (s *fakeStore) PutHeartbeat(_ context.Context, hb store.Heartbeat) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hbs[hb.Owner] = hb
	return nil
}

func (s *fakeStore) LastHeartbeat(ctx context.Context) (store.Heartbeat, bool, error) {
	hbs, _ := s.Heartbeats(ctx)
	if len(hbs) == 0 {
		return store.Heartbeat{}, false, nil
	}
	return hbs[0], true, nil
}

func (s *fakeStore) Heartbeats(context.Context) ([]store.Heartbeat, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []store.Heartbeat
	for _, hb := range s.hbs {
		out = append(out, hb)
	}
	slices.SortFunc(out, func(a, b store.Heartbeat) int { return cmp.Or(b.Time.Compare(a.Time), cmp.Compare(a.Owner, b.Owner)) })
	return out, nil
}

func (s *fakeStore) TryLock(_ context.Context, name string) (func() error, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.locks[name] {
		return nil, false, nil
	}
	s.locks[name] = true
	return func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.locks, name)
		return nil
	}, true, nil
}

func (s *fakeStore) SourceFile(_ context.Context, partition, path string) (store.SourceFile, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.files[[2]string{partition, path}]
	return f, ok, nil
}

func (s *fakeStore) PutSourceFile(_ context.Context, f store.SourceFile) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.files[[2]string{f.Partition, f.Path}] = f
	return nil
}

func (s *fakeStore) Info() store.Info { return store.Info{Backend: "fake", Location: "memory"} }

func (s *fakeStore) AddEvent(_ context.Context, e store.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, e)
	return nil
}

func (s *fakeStore) Events(_ context.Context, limit int) ([]store.Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Clone(s.events)
	slices.Reverse(out)
	return out[:upTo(limit, len(out))], nil
}

type minuteKey struct {
	t                int64
	worker, endpoint string
}

func (s *fakeStore) PutMinutes(_ context.Context, ms []store.Minute) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.minutes == nil {
		s.minutes = map[minuteKey]store.Minute{}
	}
	for _, m := range ms {
		s.minutes[minuteKey{m.Time.UnixNano(), m.Worker, m.Endpoint}] = m
	}
	return nil
}

func (s *fakeStore) Minutes(_ context.Context, since time.Time) ([]store.Minute, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []store.Minute
	for _, m := range s.minutes {
		if !m.Time.Before(since) {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b store.Minute) int {
		return cmp.Or(a.Time.Compare(b.Time), cmp.Compare(a.Worker, b.Worker), cmp.Compare(a.Endpoint, b.Endpoint))
	})
	return out, nil
}

func (s *fakeStore) browseRow(x *fakeSample) store.Row {
	r := store.Row{ID: x.ID, Partition: x.Partition, Lane: x.Lane, State: x.state, Body: x.Body,
		Attempts: x.attempts, Result: x.result, Reason: x.lastErr, FinishedAt: x.finishedAt, Origin: x.Origin,
		Prior: slices.Clone(x.prior)}
	if x.state == store.Rejected {
		r.Reason, r.Rule = x.reason, x.rule
	}
	return r
}

func (s *fakeStore) Sample(_ context.Context, id string) (store.Row, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	x, ok := s.samples[id]
	if !ok {
		return store.Row{}, false, nil
	}
	return s.browseRow(x), true, nil
}

func (s *fakeStore) Samples(_ context.Context, q store.SampleQuery) ([]store.Row, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []store.Row
	for _, x := range s.samples {
		if x.ID > q.After && (q.Partition == "" || x.Partition == q.Partition) && (q.State == "" || x.state == q.State) {
			r := s.browseRow(x)
			r.Body, r.Result.Response, r.Prior = nil, nil, nil
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b store.Row) int { return cmp.Compare(a.ID, b.ID) })
	limit := q.Limit
	if limit <= 0 {
		limit = 100
	}
	return out[:min(limit, len(out))], nil
}

func (s *fakeStore) Close() error { return nil }

// upTo applies a read limit: limit <= 0 means all n.
func upTo(limit, n int) int {
	if limit <= 0 {
		return n
	}
	return min(limit, n)
}
