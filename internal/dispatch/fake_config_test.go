package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// The fake's configuration generations, with the real backends' requeue.

func (s *fakeStore) Configure(_ context.Context, c store.Config, o store.ConfigureOptions) (store.Generation, error) {
	if c.Fingerprint == "" {
		return store.Generation{}, errors.New("configure: empty fingerprint")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	cur, ok := store.Current(s.gens)
	g, record, requeue, err := store.NextGeneration(cur, ok, c, o, now)
	if err != nil || !record {
		return g, err
	}
	if requeue {
		g.Requeued = s.requeueAll(o.Lanes)
	}
	s.gens = append(s.gens, g)
	return g, nil
}

// requeueAll drops every answer from the dataset (counting it against its
// generation) and returns every sample to a fresh start.
func (s *fakeStore) requeueAll(lanes []store.LaneRange) int {
	for i := range s.answers {
		a := &s.answers[i]
		if a.gone {
			continue
		}
		a.gone = true
		for j := range s.gens {
			if s.gens[j].N == a.r.Generation {
				s.gens[j].Superseded++
			}
		}
	}
	n := 0
	for _, x := range s.samples {
		if x.state != store.Pending || x.turn > 0 || x.attempts > 0 || !x.notBefore.IsZero() {
			n++
		}
		x.state, x.owner, x.turn, x.attempts, x.notBefore, x.finishedAt = store.Pending, "", 0, 0, time.Time{}, time.Time{}
		x.result, x.prior, x.reason, x.rule, x.lastErr, x.errAt = store.Result{}, nil, "", "", "", time.Time{}
		for _, l := range lanes {
			if l.Partition == x.Partition && x.PromptTokens >= l.MinTokens && (l.MaxTokens == 0 || x.PromptTokens <= l.MaxTokens) {
				x.Lane = l.Lane
			}
		}
	}
	return n
}

func (s *fakeStore) Generations(context.Context) ([]store.Generation, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := append([]store.Generation(nil), s.gens...)
	if len(out) > 0 {
		for _, a := range s.answers {
			if !a.gone {
				out[len(out)-1].Answers++
			}
		}
	}
	return out, nil
}

func (s *fakeStore) SetServedModel(_ context.Context, gen int, model string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.gens {
		if s.gens[i].N == gen {
			if s.gens[i].ServedModel == "" {
				s.gens[i].ServedModel = model
			}
			return s.gens[i].ServedModel, nil
		}
	}
	return "", fmt.Errorf("record served model: no generation %d", gen)
}
