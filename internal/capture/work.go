package capture

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/regen-dev/regen/internal/dispatch"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/reply"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/tokenrows"
)

// item is one training row to capture.
type item struct {
	store.CaptureKey
	ids []int64
}

// walkBatch is how many keys one state lookup covers.
const walkBatch = 256

// walk sends every done row's keys that are neither captured nor dead.
func (r *runner) walk(ctx context.Context, work chan<- item, first bool) error {
	batch := make([]item, 0, walkBatch)
	flush := func() error {
		err := r.sendPending(ctx, batch, work, first)
		batch = batch[:0]
		return err
	}
	err := r.st.Finished(ctx, func(row store.Row) error {
		if row.State != store.Done {
			return nil
		}
		for _, it := range r.items(row, first) {
			batch = append(batch, it)
			if len(batch) == walkBatch {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("capture: %w", err)
	}
	if err == nil && first && r.cfg.Walked != nil {
		r.mu.Lock()
		rows := r.sum.Rows
		r.mu.Unlock()
		r.cfg.Walked(ctx, rows)
	}
	return err
}

// items are a done row's training rows with ids (package tokenrows, as
// export builds them).
func (r *runner) items(row store.Row, first bool) []item {
	out, noIDs, err := rowItems(row, r.cfg.PerTurn)
	if err != nil {
		r.cfg.Log.Warn("capture_row_unreadable", "sample", row.ID, "err", err)
		noIDs = 1
	}
	r.count(first, func(s *Summary) { s.Rows += len(out); s.NoIDs += noIDs })
	return out
}

// rowItems are a done row's training rows with ids, each keyed with the
// hash of its ids, and how many of its rows have none.
func rowItems(row store.Row, perTurn bool) ([]item, int, error) {
	recs, err := reply.Answers(row)
	if err != nil {
		return nil, 0, err
	}
	answers := make([]llm.Result, len(recs))
	for i, rec := range recs {
		answers[i] = rec.Result
	}
	var out []item
	noIDs := 0
	for _, tr := range tokenrows.Rows(row.ID, answers, perTurn, func(int) string { return "the server" }) {
		if tr.Missing != "" {
			noIDs++
			continue
		}
		ids := make([]int64, len(tr.InputIDs))
		for i, id := range tr.InputIDs {
			ids[i] = int64(id)
		}
		out = append(out, item{CaptureKey: store.CaptureKey{Key: tr.ID, SampleID: row.ID, Turn: tr.Turn, Input: tokenrows.InputHash(tr.InputIDs)}, ids: ids})
	}
	return out, noIDs, nil
}

// count changes the summary during the first pass (later passes walk the
// same rows again).
func (r *runner) count(first bool, fn func(*Summary)) {
	if !first {
		return
	}
	r.mu.Lock()
	fn(&r.sum)
	r.mu.Unlock()
}

// sendPending looks the batch's keys up and sends those still to do.
func (r *runner) sendPending(ctx context.Context, batch []item, work chan<- item, first bool) error {
	if len(batch) == 0 {
		return nil
	}
	keys := make([]string, len(batch))
	for i, it := range batch {
		keys[i] = it.Key
	}
	states, err := r.st.CaptureStates(ctx, keys)
	if err != nil {
		return err
	}
	for _, it := range batch {
		st, ok := states[it.Key]
		same := ok && (st.Input == "" || st.Input == it.Input)
		switch {
		case same && st.State == store.Done:
			r.count(first, func(s *Summary) { s.Before++ })
		case same && st.State == store.Dead:
		default: // new, pending, leased, or done or dead for other ids
			select {
			case work <- it:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

// capture claims one key and settles it: recorded, dead, or left to the
// worker that holds it.
func (r *runner) capture(ctx context.Context, it item) error {
	c, ok, err := r.st.ClaimCapture(ctx, it.CaptureKey, r.cfg.Owner, r.cfg.Lease)
	if err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	if !ok {
		r.held.Add(1)
		return nil
	}
	dst := filepath.Join(r.cfg.Dir, StableName(c.Key)+Ext)
	if stop, err := r.clearHandedOn(ctx, c, dst); stop || err != nil {
		return err
	}
	attempts := c.Attempts
	for {
		done, err := r.adopt(ctx, c, it.ids, dst)
		if done || err != nil {
			return err
		}
		own, err := r.attempt(ctx, c, it.ids, dst)
		if errors.Is(err, ErrExists) {
			continue // placed meanwhile by another worker: adopt it
		}
		if err != nil || own == nil {
			return err
		}
		attempts++
		dead := attempts >= r.cfg.MaxAttempts
		evidence := own.Kind + ": " + own.Detail
		if err := r.st.FailCapture(ctx, c, evidence, dead); err != nil {
			return r.lost(c, err)
		}
		if dead { // one line a dead key: the evidence (the store keeps it too)
			r.cfg.Log.Warn("capture_dead", "key", c.Key, "attempts", attempts, "evidence", evidence)
			return nil
		}
		r.count(true, func(s *Summary) { s.Retried++ })
		if err := sleep(ctx, dispatch.Delay(attempts, r.cfg.BaseDelay, r.cfg.MaxDelay, rand.Float64())); err != nil {
			return err
		}
	}
}

// lost turns a lost lease into no error (the key's new holder settles it;
// this run looks again in its next pass, as at a key another worker holds)
// and anything else into the run's error.
func (r *runner) lost(c store.CaptureClaim, err error) error {
	if errors.Is(err, store.ErrNotLeased) {
		r.count(true, func(s *Summary) { s.LeasesLost++ })
		r.held.Add(1)
		return nil
	}
	return fmt.Errorf("capture: %w", err)
}

// adopt records a file already in place under the key's name (placed by a
// run killed before it recorded it, or by a worker that lost its lease),
// once it passes the same check as a new one; a file that fails it is not
// this key's capture (its ids changed since) and is set aside.
func (r *runner) adopt(ctx context.Context, c store.CaptureClaim, ids []int64, dst string) (bool, error) {
	if _, err := os.Lstat(dst); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("capture: %w", err)
	}
	info, err := CheckFile(dst, ids, r.expected())
	if _, ok := ownError(err); ok {
		return r.setAside(ctx, c, dst)
	}
	if err != nil {
		return false, fmt.Errorf("capture: %w", err)
	}
	// The run that placed it may have died between its rename and the
	// folder's sync: the entry is durable before the record that lists it.
	if err := r.dirSync.Sync(); err != nil {
		return false, fmt.Errorf("capture %s: %w", c.Key, err)
	}
	ok, err := r.record(ctx, c, dst, info) // not ok: a lost lease, the key's new holder settles it
	if ok {
		r.count(true, func(s *Summary) { s.Adopted++; s.Bytes += info.Bytes })
	}
	return true, err
}

// setAside moves a file at the key's name that fails the key's check out
// of the way, once the store confirms this worker still holds the key: a
// worker whose lease lapsed leaves alone what the key's new holder placed
// and recorded. With other workers (Shared) the file is renamed to a
// temporary name Sweep removes later, not deleted, so even a pause past
// the confirmed lease loses nothing at once; a sole worker removes it. It
// reports true (nothing more to do) on a lost lease.
func (r *runner) setAside(ctx context.Context, c store.CaptureClaim, dst string) (bool, error) {
	if err := r.st.ConfirmCapture(ctx, c, r.cfg.Lease); err != nil {
		return true, r.lost(c, err)
	}
	var err error
	if r.cfg.Shared {
		err = os.Rename(dst, partPath(r.cfg.Dir))
	} else {
		err = os.Remove(dst) // the sole worker (it holds the store's lock): its space is needed now
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("capture %s: set aside %s: %w", c.Key, dst, err)
	}
	r.count(true, func(s *Summary) { s.SetAside++ })
	return false, r.dirSync.Sync()
}

// attempt sends the key until a server answers, then checks and places
// the file. It returns the key's own failure, or nil and nil when the key
// is recorded (or its lease lost), or the run's error.
func (r *runner) attempt(ctx context.Context, c store.CaptureClaim, ids []int64, dst string) (*FileError, error) {
	for {
		ep, err := r.eps.acquire(ctx)
		if err != nil {
			return nil, err
		}
		var noted error // the server's file is noted before it is waited for, read or moved
		named := func(p string) error { noted = r.st.NoteCaptureServerPath(ctx, c, p); return noted }
		res, err := ep.Client.Capture(ctx, Request{Key: c.Key, InputIDs: ids, Named: named})
		own, isOwn := ownError(err)
		switch {
		case ctx.Err() != nil:
			r.eps.release(ep, nil)
			r.dropServerFiles(res)
			return nil, ctx.Err()
		case noted != nil: // a lost lease (the key's new holder captures it) or the store's error
			r.released(ep, nil)
			r.dropServerFiles(res)
			return nil, r.lost(c, noted)
		case err != nil && !isOwn:
			r.released(ep, err)
			r.count(true, func(s *Summary) { s.ServerErrors++ })
			r.dropServerFiles(res)
			continue
		}
		r.released(ep, nil)
		if isOwn {
			r.dropServerFiles(res)
			return own, nil
		}
		return r.place(ctx, c, ids, dst, res)
	}
}

// place checks the server's file against the ids sent, moves it into the
// folder and records it. A file already under the name is ErrExists.
func (r *runner) place(ctx context.Context, c store.CaptureClaim, ids []int64, dst string, res Result) (*FileError, error) {
	defer r.dropServerFiles(res)
	if i := firstDiff(res.PromptIDs, ids); i >= 0 {
		return &FileError{Path: res.Path, Kind: KindPromptIDs, Detail: promptDiff(res.PromptIDs, ids, i)}, nil
	}
	info, err := CheckFile(res.Path, ids, r.expected())
	if fe, ok := ownError(err); ok {
		return fe, nil
	}
	if err != nil {
		return nil, fmt.Errorf("capture %s: %w", c.Key, err)
	}
	if err := move(res.Path, dst); err != nil {
		return nil, r.notMoved(ctx, c, err)
	}
	r.dropServerFiles(res) // the lock: nobody else removes it; the row still names the file if a kill comes first
	// The entry is durable before the record that lists it.
	if err := r.dirSync.Sync(); err != nil {
		return nil, fmt.Errorf("capture %s: %w", c.Key, err)
	}
	r.fix(info)
	ok, err := r.record(ctx, c, dst, info)
	if ok {
		r.count(true, func(s *Summary) { s.Captured++; s.Bytes += info.Bytes })
	}
	return nil, err
}

// notMoved is the error of a move that failed: ErrExists as it is; a
// server's file gone meanwhile is a lost lease when the store says so (the
// key's new holder removed what this worker was handed).
func (r *runner) notMoved(ctx context.Context, c store.CaptureClaim, err error) error {
	if errors.Is(err, ErrExists) {
		return err
	}
	if errors.Is(err, fs.ErrNotExist) {
		if cerr := r.st.ConfirmCapture(ctx, c, r.cfg.Lease); cerr != nil {
			return r.lost(c, cerr)
		}
	}
	return fmt.Errorf("capture %s: %w", c.Key, err)
}

// record lists the placed file dst as c's capture and reports whether it
// did; a lost lease is no error (the key's new holder finds the file and
// adopts it). The error of Config.Recheck follows a record that was made.
func (r *runner) record(ctx context.Context, c store.CaptureClaim, dst string, info FileInfo) (bool, error) {
	f := store.CapturedFile{CaptureKey: c.CaptureKey, Path: job.RelTo(r.cfg.JobDir, dst), Bytes: info.Bytes, SHA256: info.SHA256,
		Tokens: info.Shape.Tokens, Layers: info.Shape.Layers, Hidden: info.Shape.Hidden, DType: info.DType}
	if err := r.st.RecordCapture(ctx, c, f); err != nil {
		return false, r.lost(c, err)
	}
	if r.cfg.Recheck != nil {
		r.recheck.Do(func() { r.recheckErr = r.cfg.Recheck(ctx) })
		if r.recheckErr != nil {
			return true, r.recheckErr
		}
	}
	return true, nil
}

// firstDiff is the first index where got and want differ (a length
// difference counts at the shorter one's end), -1 when equal.
func firstDiff(got, want []int64) int {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return i
		}
	}
	if len(got) != len(want) {
		return min(len(got), len(want))
	}
	return -1
}

func promptDiff(got, want []int64, i int) string {
	if i < len(got) && i < len(want) {
		return fmt.Sprintf("the answer's prompt_token_ids[%d] = %d, sent %d (%d ids)", i, got[i], want[i], len(want))
	}
	return fmt.Sprintf("the answer has %d prompt_token_ids, sent %d", len(got), len(want))
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// released ends a request on ep, logging the endpoint going down or
// coming back.
func (r *runner) released(ep *endpoint, failed error) {
	if !r.eps.release(ep, failed) {
		return
	}
	if failed != nil {
		r.cfg.Log.Warn("capture_endpoint_failing", "endpoint", ep.URL, "err", failed)
	} else {
		r.cfg.Log.Info("capture_endpoint_up", "endpoint", ep.URL)
	}
}
