package capture

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
)

// Layout is what one token's hidden states take in a file: layers x
// hidden elements of dtype. Source says where the numbers came from (the
// captured files, the job's capture section, the model's config.json).
type Layout struct {
	Layers int    `json:"layers"`
	Hidden int    `json:"hidden"`
	DType  string `json:"dtype"`
	Source string `json:"source,omitempty"`
}

// HeaderBytes is what a file holds besides its tensors: the 8-byte length
// and the JSON header naming both tensors, padded to 8 (about 150 bytes
// for two tensors without metadata; 256 leaves room for a __metadata__).
const HeaderBytes = 256

// MarginPercent is the headroom a capture keeps over its estimate before
// it starts: the token counts come from the servers' usage and the header
// size is a guess, so the need is not exact.
const MarginPercent = 5

// FileBytes is the estimated size of one file of tokens tokens: its
// hidden_states (tokens x layers x hidden x dtype bytes), its token_ids
// (8 bytes each) and its header.
func FileBytes(tokens int, l Layout) int64 {
	return HeaderBytes + int64(tokens)*(8+int64(l.Layers)*int64(l.Hidden)*int64(DTypeBytes(l.DType)))
}

// Estimate is the storage a job's capture writes: every capture of a done
// sample (a whole conversation, or each turn row), less what the files
// already captured take, against the free space where they go.
type Estimate struct {
	Layout
	Samples       int    `json:"samples"` // done samples
	Files         int    `json:"files"`   // captures: one per sample, or one per turn row
	Tokens        int64  `json:"tokens"`
	Bytes         int64  `json:"bytes"` // all files, estimated
	Captured      int    `json:"captured"`
	CapturedBytes int64  `json:"captured_bytes"` // of the files already captured, as recorded
	Dir           string `json:"dir"`            // the folder the files go to, as the messages name it (relative to the job file)
	FreeBytes     int64  `json:"free_bytes"`     // available to regen on Dir's filesystem
}

// Remaining is the bytes still to write: the estimate less the captured
// files' recorded size.
func (e Estimate) Remaining() int64 { return max(0, e.Bytes-e.CapturedBytes) }

// Margin is the headroom kept over Remaining (MarginPercent of it).
func (e Estimate) Margin() int64 { return e.Remaining() * MarginPercent / 100 }

// Fits reports whether the files still to write, with the margin, fit in
// the free space.
func (e Estimate) Fits() bool { return e.Remaining()+e.Margin() <= e.FreeBytes }

// captureTokens are the token counts of a done row's captures: its whole
// conversation (the last turn's prompt and completion: the input_ids of
// the conversation's row), or each turn's prompt and completion (a turn
// row's input_ids), from the counts stored with each answer.
func captureTokens(r store.Row, turnRows bool) []int {
	last := r.Result.PromptTokens + r.Result.CompletionTokens
	if !turnRows {
		return []int{last}
	}
	out := make([]int, 0, len(r.Prior)+1)
	for _, p := range r.Prior {
		out = append(out, p.PromptTokens+p.CompletionTokens)
	}
	return append(out, last)
}

// Rows is the walk of the finished samples an estimate reads.
type Rows interface {
	Finished(ctx context.Context, fn func(store.Row) error) error
}

// EstimateStore sums the captures of every done sample in the store
// (turnRows: one per assistant turn) into an Estimate for layout l. It
// reads the stored counts, not the ids, and holds one row at a time.
func EstimateStore(ctx context.Context, ds Rows, turnRows bool, l Layout) (Estimate, error) {
	e := Estimate{Layout: l}
	err := ds.Finished(ctx, func(r store.Row) error {
		if r.State != store.Done {
			return nil
		}
		e.Samples++
		for _, n := range captureTokens(r, turnRows) {
			e.Files++
			e.Tokens += int64(n)
			e.Bytes += FileBytes(n, l)
		}
		return nil
	})
	if err != nil {
		return Estimate{}, fmt.Errorf("estimate capture storage: %w", err)
	}
	return e, nil
}

// FreeSpace is the space available to this process on the filesystem that
// holds dir (statfs: blocks available to unprivileged users), asking the
// nearest folder that exists when dir does not yet.
func FreeSpace(dir string) (int64, error) {
	at := filepath.Clean(dir)
	for {
		var st unix.Statfs_t
		err := unix.Statfs(at, &st)
		if err == nil {
			return int64(st.Bavail) * int64(st.Bsize), nil
		}
		parent := filepath.Dir(at)
		if !errors.Is(err, fs.ErrNotExist) || parent == at {
			return 0, fmt.Errorf("free space of %s: %w", dir, err)
		}
		at = parent
	}
}

// SpaceError refuses a capture whose files do not fit.
type SpaceError struct{ Estimate Estimate }

func (e *SpaceError) Error() string {
	return "hidden-state capture " + e.Estimate.Need()
}

// Need says in one line what the capture needs and what there is:
// "needs 1.3 TB for 88,000 samples (412,000,000 tokens x 4 layers x 4096
// hidden x 2 bytes bf16, + 5% margin); /data has 412 GB free".
func (e Estimate) Need() string {
	files := ""
	if e.Files != e.Samples {
		files = fmt.Sprintf(" (%s turn rows)", monitor.Count(int64(e.Files)))
	}
	done := ""
	if e.Captured > 0 {
		done = fmt.Sprintf(", less %s already captured in %s files", monitor.Size(e.CapturedBytes), monitor.Count(int64(e.Captured)))
	}
	return fmt.Sprintf("needs %s for %s samples%s (%s tokens x %d layers x %d hidden x %d bytes %s%s, + %d%% margin); %s has %s free",
		monitor.Size(e.Remaining()+e.Margin()), monitor.Count(int64(e.Samples)), files, monitor.Count(e.Tokens), e.Layers, e.Hidden,
		DTypeBytes(e.DType), e.DType, done, MarginPercent, e.Dir, monitor.Size(e.FreeBytes))
}

// Measure returns e with the free space of the filesystem holding path
// (the capture folder, absolute).
func (e Estimate) Measure(path string) (Estimate, error) {
	free, err := FreeSpace(path)
	if err != nil {
		return e, err
	}
	e.FreeBytes = free
	return e, nil
}

// Refusal is a *SpaceError when the files still to write, with the
// margin, do not fit in the free space measured; nil when they do.
func (e Estimate) Refusal() error {
	if e.Fits() {
		return nil
	}
	return &SpaceError{Estimate: e}
}
