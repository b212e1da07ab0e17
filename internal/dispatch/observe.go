package dispatch

import (
	"errors"
	"time"

	"github.com/regen-dev/regen/internal/llm"
)

// Attempt is one finished request, as Config.Observe sees it.
type Attempt struct {
	Lane     string
	Endpoint string
	// Outcome is "ok", "cancelled" (paused or drained: released, no attempt
	// spent), "moved" (cancelled while queued, to go to a server with room),
	// "shed" (cancelled to bring KV usage down), "unneeded" (a backup
	// cancelled because the first request's answer fit) or the error's class
	// ("retryable", "server-down", "bad-request", "malformed", "backpressure").
	Outcome          string
	Duration         time.Duration // from send to the last byte or the error
	TTFT             time.Duration // 0 when no token arrived
	CompletionTokens int
	// TokenIDs: the answer carried its completion token ids.
	TokenIDs bool
}

// Outcomes of an Attempt besides the error classes.
const (
	OutcomeOK        = "ok"
	OutcomeCancelled = "cancelled"
	OutcomeMoved     = "moved"
	OutcomeShed      = "shed"
	OutcomeUnneeded  = "unneeded"
)

// NotErrors lists every Attempt outcome that is not an error class; the
// metrics spell them apart from dispatch, and a runner test holds the two
// lists together.
var NotErrors = []string{OutcomeOK, OutcomeCancelled, OutcomeMoved, OutcomeShed, OutcomeUnneeded}

func (d *Dispatcher) observe(lane, url string, start time.Time, res llm.Result, err, cause error) {
	if d.cfg.Observe == nil {
		return
	}
	a := Attempt{Lane: lane, Endpoint: url, Outcome: OutcomeOK, Duration: d.now().Sub(start), TTFT: res.TTFT,
		CompletionTokens: res.Usage.CompletionTokens, TokenIDs: len(res.CompletionTokenIDs) > 0}
	switch {
	case err == nil:
	case errors.Is(cause, errPaused) || errors.Is(cause, errDrain):
		a.Outcome = OutcomeCancelled
	case errors.Is(cause, errMoved):
		a.Outcome = OutcomeMoved
	case errors.Is(cause, errShed):
		a.Outcome = OutcomeShed
	case errors.Is(cause, errHedgeDropped):
		a.Outcome = OutcomeUnneeded
	default:
		a.Outcome = llm.ClassOf(err).String()
	}
	d.cfg.Observe(a)
}
