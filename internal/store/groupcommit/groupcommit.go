// Package groupcommit coalesces concurrent store writes into shared
// transactions. Callers block in Do until the transaction holding their
// request has committed (or failed), so a write still counts only once it is
// durable; what changes is that N callers arriving together pay for one
// commit instead of N.
//
// There is no timer: one goroutine commits whatever has queued since its
// last commit started. Alone, a request commits at once; under load,
// batches grow by themselves to what arrives during one commit. The package
// knows nothing about SQL; a backend supplies the function that commits a
// batch and reports one error per request.
package groupcommit

import (
	"context"
	"errors"
	"sync"
)

// ErrClosed is returned by Do after Close.
var ErrClosed = errors.New("store closed")

// CommitFunc commits a batch in one transaction where it can and returns one
// error per request, in order (nil for each that is durable now).
type CommitFunc[T any] func(ctx context.Context, batch []T) []error

// Queue feeds one committer goroutine. The zero value is not usable; use New.
type Queue[T any] struct {
	commit CommitFunc[T]
	max    int
	in     chan request[T]

	closeOnce sync.Once
	stop      chan struct{}
	done      chan struct{}
}

type request[T any] struct {
	v     T
	reply chan error
}

// New starts a queue whose committer takes up to max requests per batch
// (max <= 0 means 256).
func New[T any](max int, commit CommitFunc[T]) *Queue[T] {
	if max <= 0 {
		max = 256
	}
	q := &Queue[T]{commit: commit, max: max, in: make(chan request[T], max), stop: make(chan struct{}), done: make(chan struct{})}
	go q.run()
	return q
}

// Do queues v and waits until its batch is committed; it returns v's own
// outcome. If ctx ends first, Do returns ctx's error, and v may or may not
// have been committed: the caller must treat the write as unknown, which a
// store's lease checks make safe to retry.
func (q *Queue[T]) Do(ctx context.Context, v T) error {
	r := request[T]{v: v, reply: make(chan error, 1)}
	select {
	case <-q.stop:
		return ErrClosed
	default:
	}
	select {
	case q.in <- r:
	case <-q.stop:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-r.reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-q.done:
		// The committer replies before it ends, so a reply not there now
		// means the request came in after its last drain.
		select {
		case err := <-r.reply:
			return err
		default:
			return ErrClosed
		}
	}
}

// Close commits what is queued and stops the committer. Do calls made after
// Close return ErrClosed.
func (q *Queue[T]) Close() {
	q.closeOnce.Do(func() { close(q.stop) })
	<-q.done
}

func (q *Queue[T]) run() {
	defer close(q.done)
	batch := make([]request[T], 0, q.max)
	vals := make([]T, 0, q.max)
	for {
		batch = batch[:0]
		select {
		case r := <-q.in:
			batch = append(batch, r)
		case <-q.stop:
			// Drain what was queued before Close so no caller waits forever.
			for {
				select {
				case r := <-q.in:
					batch = append(batch, r)
					if len(batch) == q.max {
						q.flush(batch, vals)
						batch = batch[:0]
					}
				default:
					if len(batch) > 0 {
						q.flush(batch, vals)
					}
					return
				}
			}
		}
	more:
		for len(batch) < q.max {
			select {
			case r := <-q.in:
				batch = append(batch, r)
			default:
				break more
			}
		}
		q.flush(batch, vals)
	}
}

func (q *Queue[T]) flush(batch []request[T], vals []T) {
	vals = vals[:0]
	for _, r := range batch {
		vals = append(vals, r.v)
	}
	errs := q.commit(context.Background(), vals)
	for i, r := range batch {
		var err error
		if i < len(errs) {
			err = errs[i]
		} else {
			err = errors.New("group commit: no outcome reported for this request")
		}
		r.reply <- err
	}
	clear(vals) // drop references to results until the next batch
}
