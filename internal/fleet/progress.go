package fleet

import (
	"time"

	"github.com/regen-dev/regen/internal/job"
)

// ProgressTimeout is how long a request's stream may send bytes that carry
// no token (keep-alives, empty chunks) before the client cuts it: half the
// hang deadline, and no more than the idle timeout. The cut is judged per
// request (the sample's fault while the server works, an outage when it
// does not); past the hang deadline the hang rule would pause the whole
// endpoint instead, which spends nothing and learns nothing, so one
// sample's endless keep-alives at a job's end would pause it for ever.
func ProgressTimeout(spec *job.Spec) time.Duration {
	hang := spec.Monitor.HangAfter
	if spec.Server != nil && spec.Server.HangTimeout > 0 {
		hang = spec.Server.HangTimeout
	}
	if hang <= 0 {
		hang = job.DefaultHangAfter
	}
	p := hang / 2
	if idle := spec.Generation.IdleTimeout; idle > 0 && idle < p {
		p = idle
	}
	return p
}
