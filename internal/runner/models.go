package runner

import (
	"context"
	"fmt"

	"github.com/regen-dev/regen/internal/monitor"
)

// NothingDoneError is returned by a run that finished with every sample
// dead-lettered or rejected: the training files hold no row, and that is
// a failure to report, not a success.
type NothingDoneError struct {
	Total, Dead, Rejected int
}

func (e *NothingDoneError) Error() string {
	return fmt.Sprintf("job finished with no sample done: %d of %d dead-lettered, %d rejected; the training files are empty (regen status lists the reasons)",
		e.Dead, e.Total, e.Rejected)
}

// nothingDone returns a NothingDoneError when the job has samples and none
// of them is done.
func (r *runState) nothingDone(ctx context.Context) error {
	counts, err := r.o.Store.Counts(ctx)
	if err != nil {
		return nil // the run finished; the counts only judge it
	}
	_, t := monitor.Cells(counts)
	if t.Total == 0 || t.Done > 0 {
		return nil
	}
	return &NothingDoneError{Total: t.Total, Dead: t.Dead, Rejected: t.Rejected}
}
