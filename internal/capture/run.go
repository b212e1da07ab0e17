package capture

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/regen-dev/regen/internal/store"
)

// Store is what the capture reads and writes: the done samples and the
// capture table.
type Store interface {
	store.Captures
	Finished(ctx context.Context, fn func(store.Row) error) error
}

// Config is one capture run.
type Config struct {
	Dir         string // absolute: the folder files are placed in
	JobDir      string // recorded paths are relative to it (when inside it)
	Endpoints   []Endpoint
	Concurrency int
	Expect      Expect // zero fields: the first file (this run's or recorded) fixes them
	PerTurn     bool   // output.token_rows: turn
	MaxAttempts int    // a key's own failures before it is dead
	Owner       string // lease owner
	// Shared: other workers may capture the same job (a PostgreSQL store),
	// so their leases and temporary copies are left alone.
	Shared              bool
	Lease               time.Duration // default 2m
	BaseDelay, MaxDelay time.Duration // a key's wait after its own failure; default 1s, 30s
	DownAfter           time.Duration // every endpoint down this long stops the run; 0 = never
	// Recheck, when set, runs once after the first file this run records
	// (the storage preflight, skipped while the hidden size was unknown);
	// its error stops the run.
	Recheck func(ctx context.Context) error
	Log     *slog.Logger
	// Walked, when set, is told after the first full walk how many rows
	// with ids the job has (the views' total).
	Walked func(ctx context.Context, rows int)
}

// Summary is what a run did.
type Summary struct {
	Rows         int // training rows with token ids
	NoIDs        int // training rows without ids (nothing to capture)
	Captured     int // captured and recorded by this run
	Adopted      int // placed by a killed run, checked and recorded by this one
	Before       int // recorded before this run
	SetAside     int // files at a key's name that failed its check: removed, or renamed for Sweep when Shared
	Retried      int // a key's own failures retried (the store keeps each one's evidence)
	ServerErrors int // requests a server failed (no attempt spent)
	LeasesLost   int // keys whose lease another worker took meanwhile
	// ServerLeftovers are server files and locks an earlier attempt (a
	// killed run, a lost lease) was handed and left, removed by this run.
	ServerLeftovers int
	Dead            int   // dead now (the whole job)
	Bytes           int64 // of the files this run recorded
	FirstDead       string
}

// ErrIncomplete is Summary.Err's error: some keys are dead.
var ErrIncomplete = errors.New("capture incomplete")

// Err is nil when every row with ids is captured, else ErrIncomplete with
// the first dead key's evidence.
func (s Summary) Err() error {
	if s.Dead == 0 {
		return nil
	}
	return fmt.Errorf("%w: %d of %d rows dead (first: %s)", ErrIncomplete, s.Dead, s.Rows, s.FirstDead)
}

type runner struct {
	cfg     Config
	st      Store
	eps     *endpoints
	dirSync *dirSync
	held    atomic.Int64 // keys another worker holds, seen in this pass

	mu     sync.Mutex
	sum    Summary
	expect Expect

	recheck    sync.Once
	recheckErr error
}

// Run captures every done row with ids that is not captured or dead yet,
// and returns when each is, or at the first error it cannot get past (the
// store, the folder, every endpoint down for DownAfter). A run killed at
// any point is resumed by the next one with nothing captured twice.
func Run(ctx context.Context, st Store, cfg Config) (Summary, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return Summary{}, err
	}
	r := &runner{cfg: cfg, st: st, eps: newEndpoints(cfg.Endpoints, cfg.DownAfter), dirSync: newDirSync(cfg.Dir), expect: cfg.Expect}
	// Keys this run still holds when it stops (an error, an interrupt) go
	// back to pending at once rather than when their leases end.
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if _, err := st.ReleaseCaptures(rctx, cfg.Owner); err != nil {
			cfg.Log.Warn("capture_release_failed", "err", err)
		}
	}()
	if err := r.prepare(ctx); err != nil {
		return r.sum, err
	}
	for first := true; ; first = false {
		r.held.Store(0)
		if err := r.pass(ctx, first); err != nil {
			return r.sum, err
		}
		if r.held.Load() == 0 {
			break
		}
		// Another worker holds keys: wait for them to be recorded, or for
		// its leases to end and take them over.
		select {
		case <-ctx.Done():
			return r.sum, ctx.Err()
		case <-time.After(min(cfg.Lease/4, 2*time.Second)):
		}
	}
	return r.finish(ctx)
}

func (c Config) withDefaults() (Config, error) {
	switch {
	case c.Dir == "":
		return c, errors.New("capture: no folder to place files in")
	case len(c.Endpoints) == 0:
		return c, errors.New("capture: no capture endpoint")
	case c.Owner == "":
		return c, errors.New("capture: no lease owner")
	}
	c.Concurrency = max(c.Concurrency, 1)
	c.MaxAttempts = max(c.MaxAttempts, 1)
	c.Lease = cmpDur(c.Lease, 2*time.Minute)
	c.BaseDelay = cmpDur(c.BaseDelay, time.Second)
	c.MaxDelay = cmpDur(c.MaxDelay, 30*time.Second)
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// prepare makes the folder, clears what a killed single worker left (its
// leases, its temporary copies, the server files it was handed) and takes the expected shape from a file
// already recorded.
func (r *runner) prepare(ctx context.Context) error {
	if err := os.MkdirAll(r.cfg.Dir, 0o755); err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	older := time.Duration(0)
	if r.cfg.Shared {
		older = 2 * r.cfg.Lease
	} else if n, err := r.st.ReleaseCaptures(ctx, ""); err != nil {
		return fmt.Errorf("capture: %w", err)
	} else if n > 0 {
		r.cfg.Log.Info("capture_leases_released", "n", n)
	}
	if !r.cfg.Shared {
		if err := r.clearLeft(ctx); err != nil {
			return err
		}
	}
	if n, err := Sweep(r.cfg.Dir, older); err != nil {
		return fmt.Errorf("capture: %w", err)
	} else if n > 0 {
		r.cfg.Log.Info("capture_parts_removed", "n", n)
	}
	stop := errors.New("first")
	err := r.st.EachCapturedFile(ctx, func(f store.CapturedFile) error {
		r.fix(FileInfo{Shape: Shape{Layers: f.Layers, Hidden: f.Hidden}, DType: f.DType})
		return stop
	})
	if err != nil && !errors.Is(err, stop) {
		return fmt.Errorf("capture: %w", err)
	}
	return nil
}

// pass walks every done row once: a producer sends the keys not yet
// captured or dead, workers capture them, a keeper extends their leases.
func (r *runner) pass(ctx context.Context, first bool) error {
	g, gctx := errgroup.WithContext(ctx)
	work := make(chan item, r.cfg.Concurrency)
	g.Go(func() error {
		defer close(work)
		return r.walk(gctx, work, first)
	})
	for range r.cfg.Concurrency {
		g.Go(func() error {
			for it := range work {
				if err := r.capture(gctx, it); err != nil {
					return err
				}
			}
			return nil
		})
	}
	kctx, stop := context.WithCancel(ctx)
	kept := make(chan struct{})
	go func() {
		defer close(kept)
		r.keepLeases(kctx)
	}()
	err := g.Wait()
	stop()
	<-kept
	return err
}

// keepLeases extends this worker's capture leases every third of a lease;
// a failure is logged: a lapsed lease costs a repeated capture at worst,
// never a second record (RecordCapture is fenced).
func (r *runner) keepLeases(ctx context.Context) {
	t := time.NewTicker(r.cfg.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := r.st.ExtendCaptureLeases(ctx, r.cfg.Owner, r.cfg.Lease); err != nil && ctx.Err() == nil {
				r.cfg.Log.Warn("capture_lease_extend_failed", "err", err)
			}
		}
	}
}

// finish counts the dead keys of the whole job.
func (r *runner) finish(ctx context.Context) (Summary, error) {
	counts, err := r.st.CaptureCounts(ctx)
	if err != nil {
		return r.sum, fmt.Errorf("capture: %w", err)
	}
	r.sum.Dead = counts.Dead
	if counts.Dead > 0 {
		fs, err := r.st.CaptureFailures(ctx, 1)
		if err != nil {
			return r.sum, fmt.Errorf("capture: %w", err)
		}
		if len(fs) > 0 {
			r.sum.FirstDead = fs[0].Key + ": " + fs[0].LastError
		}
	}
	return r.sum, nil
}

// fix takes the file's layers, hidden size and dtype as the expectation
// for the fields the job leaves open.
func (r *runner) fix(info FileInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.expect.Layers == 0 {
		r.expect.Layers = info.Shape.Layers
	}
	if r.expect.Hidden == 0 {
		r.expect.Hidden = info.Shape.Hidden
	}
	if r.expect.DType == "" {
		r.expect.DType = info.DType
	}
}

func (r *runner) expected() Expect {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.expect
}
