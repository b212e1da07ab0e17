package capture

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
)

// JobStore is a job's store as the capture of a whole job uses it.
type JobStore interface {
	Store
	TryLock(ctx context.Context, name string) (unlock func() error, ok bool, err error)
	SetMeta(ctx context.Context, key, value string, replace bool) (string, error)
	Info() store.Info
}

// LockName is the store lock a capture holds on a store one worker runs
// at a time (SQLite): its start returns every lease to pending and sweeps
// temporary copies, which only a sole capture may do.
const LockName = "capture"

// RunJob captures the job's rows (spec has a capture: section): regen run
// after generation, and regen capture alone. The error is Run's, or
// ErrIncomplete when keys are dead.
func RunJob(ctx context.Context, spec *job.Spec, st JobStore, log *slog.Logger) (Summary, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	shared := st.Info().Shared
	if !shared {
		unlock, ok, err := st.TryLock(ctx, LockName)
		if err != nil {
			return Summary{}, fmt.Errorf("capture: %w", err)
		}
		if !ok {
			return Summary{}, fmt.Errorf("capture of job %s: another regen process is capturing it (it holds the %q lock of %s); stop that process first",
				spec.Name, LockName, spec.Rel(st.Info().Location))
		}
		defer unlock()
	}
	// Before anything is sent: refuse with the numbers when the files
	// still to write do not fit the folder; an unknown hidden size (no
	// file yet, none in the job) is no refusal.
	est, preErr := Preflight(ctx, st, spec)
	if preErr != nil && !errors.Is(preErr, ErrNoLayout) {
		return Summary{}, preErr
	}
	// The estimate's count is the views' total until the walk, which
	// leaves out rows without ids, has its exact one.
	if est.Files > 0 {
		if _, err := st.SetMeta(ctx, monitor.CaptureRowsMeta, strconv.Itoa(est.Files), true); err != nil {
			log.Warn("capture_rows_not_recorded", "err", err)
		}
	}
	host, _ := os.Hostname()
	var rnd [4]byte
	rand.Read(rnd[:])
	owner := fmt.Sprintf("capture-%s-%d-%s", host, os.Getpid(), hex.EncodeToString(rnd[:]))
	cfg, err := FromJob(spec, owner, shared, log.With("stage", "capture", "owner", owner))
	if err != nil {
		return Summary{}, err
	}
	if errors.Is(preErr, ErrNoLayout) {
		// The first file fixes the layout: the preflight runs then.
		cfg.Recheck = func(ctx context.Context) error {
			if _, err := Preflight(ctx, st, spec); err != nil && !errors.Is(err, ErrNoLayout) {
				return err
			}
			return nil
		}
	}
	cfg.Walked = func(ctx context.Context, rows int) {
		if _, err := st.SetMeta(ctx, monitor.CaptureRowsMeta, strconv.Itoa(rows), true); err != nil {
			log.Warn("capture_rows_not_recorded", "err", err)
		}
	}
	sum, err := Run(ctx, st, cfg)
	if err != nil {
		return sum, err
	}
	return sum, sum.Err()
}
