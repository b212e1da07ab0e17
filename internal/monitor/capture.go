package monitor

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/regen-dev/regen/internal/store"
)

// CaptureRowsMeta is the store meta key under which the hidden-state
// capture records how many training rows with token ids it found to
// capture (its walk of the done samples), so the views have a total
// without walking the job themselves.
const CaptureRowsMeta = "capture_rows"

// CaptureProgress is the hidden-state capture's progress, from the store.
type CaptureProgress struct {
	// Total is the rows the capture found to capture, as its last walk of
	// the done samples counted them; nil before a capture walked the job.
	Total    *int  `json:"total"`
	Captured int   `json:"captured"`
	Dead     int   `json:"dead"`
	InFlight int   `json:"in_flight"`
	Pending  int   `json:"pending"` // tried before and waiting for another try (released, or failed with attempts left)
	Bytes    int64 `json:"bytes"`   // of the captured files
	Tokens   int64 `json:"tokens"`  // of the captured files
}

// CaptureReader is what ReadCapture reads.
type CaptureReader interface {
	CaptureCounts(ctx context.Context) (store.CaptureCounts, error)
	Meta(ctx context.Context, key string) (value string, ok bool, err error)
}

// ReadCapture reads the capture's counts and the total its walk recorded.
func ReadCapture(ctx context.Context, st CaptureReader) (*CaptureProgress, error) {
	c, err := st.CaptureCounts(ctx)
	if err != nil {
		return nil, fmt.Errorf("read capture counts: %w", err)
	}
	p := &CaptureProgress{Captured: c.Captured, Dead: c.Dead, InFlight: c.Leased, Pending: c.Pending, Bytes: c.Bytes, Tokens: c.Tokens}
	v, ok, err := st.Meta(ctx, CaptureRowsMeta)
	if err != nil {
		return nil, fmt.Errorf("read capture total: %w", err)
	}
	if n, perr := strconv.Atoi(v); ok && perr == nil {
		p.Total = &n
	}
	return p, nil
}

// Text is the progress as one line for the views: "1,234 of 2,000 captured
// (61.7%), 3 dead, 4 in flight, 5 to retry; 12 GB, 1,234,567 tokens".
func (p *CaptureProgress) Text() string {
	var b strings.Builder
	if p.Total != nil {
		fmt.Fprintf(&b, "%s of %s captured", Count(int64(p.Captured)), Count(int64(*p.Total)))
		if *p.Total > 0 {
			fmt.Fprintf(&b, " (%.1f%%)", 100*float64(p.Captured)/float64(*p.Total))
		}
	} else {
		fmt.Fprintf(&b, "%s captured (total not counted yet)", Count(int64(p.Captured)))
	}
	fmt.Fprintf(&b, ", %s dead, %s in flight", Count(int64(p.Dead)), Count(int64(p.InFlight)))
	if p.Pending > 0 {
		fmt.Fprintf(&b, ", %s to retry", Count(int64(p.Pending)))
	}
	fmt.Fprintf(&b, "; %s, %s tokens", Size(p.Bytes), Count(p.Tokens))
	return b.String()
}

// Size writes a byte count in decimal units as df -H does: "412 GB",
// "1.3 TB", "850 kB".
func Size(b int64) string {
	units := []string{"B", "kB", "MB", "GB", "TB", "PB", "EB"}
	v, i := float64(b), 0
	for v >= 1000 && i < len(units)-1 {
		v, i = v/1000, i+1
	}
	if i > 0 && v < 10 {
		return strconv.FormatFloat(v, 'f', 1, 64) + " " + units[i]
	}
	return strconv.FormatFloat(v, 'f', 0, 64) + " " + units[i]
}

// Count writes n with thousands separators: 88,000.
func Count(n int64) string {
	s := strconv.FormatInt(n, 10)
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return sign + b.String()
}
