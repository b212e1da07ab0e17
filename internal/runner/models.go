package runner

import (
	"context"
	"fmt"

	"github.com/regen-dev/regen/internal/monitor"
)

// NothingDoneError is returned by a run that finished with every sample
// dead-lettered or rejected, or with no sample at all (every source row
// bad, or none): the training files hold no row, and that is a failure to
// report, not a success.
type NothingDoneError struct {
	Total, Dead, Rejected int
	BadRows               int // bad source rows (dead letters at ingest)
}

func (e *NothingDoneError) Error() string {
	if e.Total == 0 {
		if e.BadRows > 0 {
			return fmt.Sprintf("job has no sample: all %d source rows read are bad (dead letters at ingest: a source's mapping may not fit its rows; regen validate and regen status say why); the training files are empty",
				e.BadRows)
		}
		return "job has no sample: its sources hold no rows; the training files are empty"
	}
	return fmt.Sprintf("job finished with no sample done: %d of %d dead-lettered, %d rejected; the training files are empty (regen status lists the reasons)",
		e.Dead, e.Total, e.Rejected)
}

// nothingDone returns a NothingDoneError when the job has no sample or
// none of them is done.
func (r *runState) nothingDone(ctx context.Context) error {
	counts, err := r.o.Store.Counts(ctx)
	if err != nil {
		return nil // the run finished; the counts only judge it
	}
	_, t := monitor.Cells(counts)
	if t.Done > 0 {
		return nil
	}
	e := &NothingDoneError{Total: t.Total, Dead: t.Dead, Rejected: t.Rejected}
	if t.Total == 0 {
		e.BadRows, _ = r.o.Store.IngestErrorCount(ctx) // only the message's detail
	}
	return e
}
