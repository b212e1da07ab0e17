package monitor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Transition is a state change worth telling someone about.
type Transition struct {
	Job      string    `json:"job"`
	Subject  string    `json:"subject"` // "job" or an endpoint URL
	From     State     `json:"from"`
	To       State     `json:"to"`
	Time     time.Time `json:"time"`
	Evidence []string  `json:"evidence,omitempty"`
}

// Alerter runs a command and/or posts a webhook on alarming transitions.
// A failing hook is reported to the caller, which logs it; it never stops a job.
type Alerter struct {
	Command []string
	Webhook string
	Timeout time.Duration // per hook; default 10s
	Client  *http.Client
}

// Wants reports whether t should fire: entering or leaving STALLED, DOWN, FAILED or DEAD.
func (a *Alerter) Wants(t Transition) bool {
	if a == nil || (len(a.Command) == 0 && a.Webhook == "") || t.From == t.To {
		return false
	}
	return Alarming(t.From) || Alarming(t.To)
}

// Notify fires every configured hook for t and joins their errors.
// The command gets the transition as JSON on stdin and in REGEN_* variables.
func (a *Alerter) Notify(ctx context.Context, t Transition) error {
	if !a.Wants(t) {
		return nil
	}
	timeout := a.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	body, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("encode alert: %w", err)
	}
	var errs []error
	if len(a.Command) > 0 {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		cmd := exec.CommandContext(cctx, a.Command[0], a.Command[1:]...)
		cmd.Stdin = bytes.NewReader(body)
		// A hook whose children keep its output open must not outlive the timeout.
		cmd.WaitDelay = time.Second
		cmd.Env = append(os.Environ(),
			"REGEN_JOB="+t.Job, "REGEN_SUBJECT="+t.Subject,
			"REGEN_FROM="+string(t.From), "REGEN_STATE="+string(t.To),
			"REGEN_EVIDENCE="+strings.Join(t.Evidence, "; "))
		if out, err := cmd.CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("alert command %s: %w: %s", a.Command[0], err, bytes.TrimSpace(out)))
		}
		cancel()
	}
	if a.Webhook != "" {
		client := a.Client
		if client == nil {
			client = &http.Client{Timeout: timeout}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.Webhook, bytes.NewReader(body))
		if err != nil {
			errs = append(errs, fmt.Errorf("alert webhook: %w", err))
		} else {
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			switch {
			case err != nil:
				errs = append(errs, fmt.Errorf("alert webhook: %w", err))
			case resp.StatusCode >= 300:
				errs = append(errs, fmt.Errorf("alert webhook: HTTP %d", resp.StatusCode))
			}
			if resp != nil {
				resp.Body.Close()
			}
		}
	}
	return errors.Join(errs...)
}
