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

// fakeStore is an in-memory store.Queue (the one role dispatch takes) with
// the same state machine as the real backends: leases with owners, expiry
// and fencing tokens, attempts, not_before, turns. Ingest puts samples in.
type fakeStore struct {
	mu      sync.Mutex
	seq     int
	samples map[string]*fakeSample

	// hook, when set, runs before every transition; a non-nil error fails it.
	hook func(op, id string) error
	// finals counts every successful final transition (done, dead) per id.
	finals map[string]int
	// claims counts Claim calls, released Release'd samples.
	claims, released int
	// tokens numbers the leases, as a shared store's fencing tokens do.
	tokens int64
	// keptClaims counts the claimed turns handed over Kept (ClaimKept).
	keptClaims int
	// after, when set, runs after every transition that took, under mu.
	after func(op string, x *fakeSample)
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
	result     store.Result
	reason     string
	rule       string
	turn       int
	prior      []store.Result
}

func newFakeStore() *fakeStore {
	return &fakeStore{samples: map[string]*fakeSample{}, finals: map[string]int{}}
}

var _ store.Queue = (*fakeStore)(nil)

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

// Ingest inserts the samples whose id is new, in order.
func (s *fakeStore) Ingest(_ context.Context, samples []store.NewSample) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, x := range samples {
		if _, ok := s.samples[x.ID]; ok {
			continue
		}
		s.seq++
		s.samples[x.ID] = &fakeSample{NewSample: x, seq: s.seq, state: store.Pending}
		n++
	}
	return n, nil
}

func (s *fakeStore) Claim(ctx context.Context, lane string, n int, owner string, lease time.Duration) ([]store.Claimed, error) {
	return s.ClaimKept(ctx, lane, n, owner, lease, nil)
}

// ClaimKept leaves out the body and earlier answers of a later turn named
// in kept whose last lease was kept's token, as the real backends do.
func (s *fakeStore) ClaimKept(_ context.Context, lane string, n int, owner string, lease time.Duration, kept []store.Kept) ([]store.Claimed, error) {
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
		isKept := x.turn > 0 && slices.Contains(kept, store.Kept{ID: x.ID, Turn: x.turn, Token: x.token}) && x.token != 0
		s.tokens++
		x.state, x.owner, x.leaseUntil, x.token = store.Leased, owner, now.Add(lease), s.tokens
		c := store.Claimed{ID: x.ID, Partition: x.Partition, Lane: x.Lane, Body: x.Body, Token: x.token,
			PromptTokens: x.PromptTokens, Attempts: x.attempts, LeaseUntil: x.leaseUntil, Turn: x.turn, Prior: slices.Clone(x.prior), Seq: int64(x.seq)}
		if isKept {
			c.Body, c.Prior, c.Kept = nil, nil, true
			s.keptClaims++
		}
		out = append(out, c)
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

// fakeOps names each transition for the hook.
var fakeOps = map[store.Op]string{store.OpTurn: "turn", store.OpRetry: "retry", store.OpDead: "dead",
	store.OpEscalate: "escalate", store.OpRelane: "relane", store.OpDefer: "defer"}

// Commit runs a transition on the held lease (of t.Token when not zero).
func (s *fakeStore) Commit(_ context.Context, t store.Transition) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	op := fakeOps[t.Op]
	if t.Op == store.OpFinish {
		op = map[store.State]string{store.Done: "complete", store.Rejected: "reject"}[t.State]
	}
	x, err := s.leased(op, t.ID, t.Owner, t.Token)
	if err != nil {
		return err
	}
	if s.after != nil {
		defer s.after(op, x)
	}
	if (t.Op == store.OpFinish || t.Op == store.OpTurn) && x.turn != t.Result.Turn {
		return fmt.Errorf("%w: the sample is at turn %d", store.ErrWrongTurn, x.turn)
	}
	switch t.Op {
	case store.OpFinish:
		x.result, x.attempts = t.Result, x.attempts+1
		if t.State == store.Rejected {
			x.reason, x.rule = t.Evidence, t.Rule
		}
		s.finish(x, t.State)
	case store.OpTurn:
		r := t.Result
		r.Lane, r.Attempts = x.Lane, x.attempts+1
		x.prior = append(x.prior, r)
		x.turn++
		x.state, x.owner, x.attempts, x.notBefore = store.Pending, "", 0, time.Time{}
		x.Lane = cmp.Or(t.Lane, x.Lane)
	case store.OpRetry:
		x.state, x.owner, x.notBefore, x.lastErr = store.Pending, "", t.NotBefore, t.LastError
		x.attempts++
	case store.OpDefer:
		x.state, x.owner, x.notBefore, x.lastErr = store.Pending, "", t.NotBefore, t.LastError
	case store.OpDead:
		x.attempts++
		x.reason, x.lastErr = t.Reason, t.Reason
		s.finish(x, store.Dead)
	case store.OpEscalate:
		x.state, x.owner, x.Lane, x.notBefore = store.Pending, "", t.Lane, time.Time{}
	case store.OpRelane:
		x.Lane = t.Lane
	default:
		return fmt.Errorf("unknown transition %d", t.Op)
	}
	return nil
}

func (s *fakeStore) hookLocked(op, id string) error {
	if s.hook == nil {
		return nil
	}
	return s.hook(op, id)
}

// leased returns the sample if owner holds its lease (the one of token,
// when not zero), after running the hook.
func (s *fakeStore) leased(op, id, owner string, token int64) (*fakeSample, error) {
	x, ok := s.samples[id]
	if token != 0 && ok && x.state == store.Leased && x.token != token {
		return nil, store.ErrNotLeased // a lease this caller lost: refused before the hook
	}
	if err := s.hookLocked(op, id); err != nil {
		return nil, err
	}
	if !ok || x.state != store.Leased || x.owner != owner {
		return nil, store.ErrNotLeased
	}
	return x, nil
}

func (s *fakeStore) finish(x *fakeSample, st store.State) {
	x.state, x.owner = st, ""
	s.finals[x.ID]++
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

// releaseWhere returns the leased samples keep selects to pending.
func (s *fakeStore) releaseWhere(keep func(*fakeSample) bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, x := range s.samples {
		if x.state == store.Leased && keep(x) {
			x.state, x.owner = store.Pending, ""
			n++
		}
	}
	return n
}

func (s *fakeStore) ReleaseOwnerExcept(_ context.Context, owner string, keep []string) (int, error) {
	return s.releaseWhere(func(x *fakeSample) bool { return x.owner == owner && !slices.Contains(keep, x.ID) }), nil
}

func (s *fakeStore) ExpireLeases(_ context.Context, now time.Time) (int, error) {
	return s.releaseWhere(func(x *fakeSample) bool { return x.leaseUntil.Before(now) }), nil
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
		x.lastErr, x.reason = "", ""
		n++
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
