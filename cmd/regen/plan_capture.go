package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/regen-dev/regen/internal/capture"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
)

// capturePlan is the hidden-state storage estimate `regen plan` shows for
// a job with a capture section. Err is set when there is no estimate (the
// hidden size is unknown); Refusal when the files do not fit.
type capturePlan struct {
	Estimate capture.Estimate `json:"estimate"`
	Margin   int64            `json:"margin_bytes"`
	Fits     bool             `json:"fits"`
	Note     string           `json:"note,omitempty"`
	err      error
}

// planCapture estimates the capture storage of the job at path from its
// store (the done samples so far, the files already captured); nil when
// the job has no capture section.
func planCapture(ctx context.Context, path string) (*capturePlan, error) {
	spec, err := job.LoadContext(ctx, path)
	if err != nil {
		return nil, err
	}
	if spec.Capture == nil {
		return nil, nil
	}
	st, err := openExisting(ctx, spec, "")
	if errors.Is(err, store.ErrNoStore) {
		l, lerr := capture.LayoutFor(ctx, nil, spec)
		c := &capturePlan{Estimate: capture.Estimate{Layout: l}, Fits: true,
			Note: "the job has not run: no done samples to estimate from yet; the capture estimates again, from the store, before it sends anything"}
		if lerr != nil {
			c.Note += "; " + lerr.Error()
		}
		return c, nil
	}
	if err != nil {
		return nil, err
	}
	defer st.Close()
	e, err := capture.EstimateJob(ctx, st, spec)
	if errors.Is(err, capture.ErrNoLayout) {
		return &capturePlan{Estimate: e, Fits: true, Note: err.Error(), err: err}, nil
	}
	if err != nil {
		return nil, err
	}
	return &capturePlan{Estimate: e, Margin: e.Margin(), Fits: e.Fits()}, nil
}

// refusal is the *capture.SpaceError when the capture does not fit.
func (c *capturePlan) refusal() error {
	if c == nil || c.Fits {
		return nil
	}
	return c.Estimate.Refusal()
}

// exit is the plan's exit error when the capture does not fit.
func (c *capturePlan) exit() error {
	if err := c.refusal(); err != nil {
		return &exitError{code: 1, err: fmt.Errorf("refused: %w", err)}
	}
	return nil
}

// writeText prints the estimate as a section of the plan.
func (c *capturePlan) writeText(w io.Writer) error {
	e := c.Estimate
	var err error
	p := func(format string, a ...any) {
		if err == nil {
			_, err = fmt.Fprintf(w, format, a...)
		}
	}
	p("\nHIDDEN-STATE CAPTURE\n")
	if e.Hidden > 0 {
		p("  layout        %d layers x %d hidden x %s (%d bytes); from %s\n", e.Layers, e.Hidden, e.DType, capture.DTypeBytes(e.DType), e.Source)
		p("  per token     %s; a sample of 8,192 tokens %s\n", monitor.Size(capture.FileBytes(1, e.Layout)-capture.HeaderBytes), monitor.Size(capture.FileBytes(8192, e.Layout)))
	}
	if c.Note != "" && e.Samples == 0 {
		p("  %s\n", c.Note)
		return err
	}
	p("  captures      %s for %s done samples, %s tokens\n", plural(e.Files, "file"), monitor.Count(int64(e.Samples)), monitor.Count(e.Tokens))
	p("  estimate      %s (tokens x layers x hidden x bytes, + 8 bytes of token id a token, + %d bytes of header a file)\n", monitor.Size(e.Bytes), capture.HeaderBytes)
	if e.Captured > 0 {
		p("  captured      %s, %s; %s still to write\n", plural(e.Captured, "file"), monitor.Size(e.CapturedBytes), monitor.Size(e.Remaining()))
	}
	verdict := "fits"
	if !c.Fits {
		verdict = "REFUSED"
	}
	p("  free space    %s on %s's filesystem; needs %s with the %d%% margin: %s\n", monitor.Size(e.FreeBytes), e.Dir,
		monitor.Size(e.Remaining()+e.Margin()), capture.MarginPercent, verdict)
	if c.Note != "" {
		p("  note          %s\n", c.Note)
	}
	return err
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return monitor.Count(int64(n)) + " " + what + "s"
}
