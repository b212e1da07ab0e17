package export

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/store"
)

// FormatHiddenSums is the checksum file of the captured hidden-state
// files: sha256sum's format, paths relative to the export folder, so
// `sha256sum -c <name>.hidden_states.sha256` run there checks them all.
const FormatHiddenSums = "hidden-states-sha256"

const hiddenSumsSuffix = ".hidden_states.sha256"

// HiddenSumsPath is where an export into dir writes name's checksum file
// of the captured hidden states.
func HiddenSumsPath(dir, name string) string { return filepath.Join(dir, name+hiddenSumsSuffix) }

// CapturedFiles is where an export reads the captured hidden-state files
// from (a job with a capture section): the store's records, whose paths
// are relative to the job file's folder (Options.JobDir), and the capture
// folder.
type CapturedFiles struct {
	Dir  string // the capture folder, absolute
	Each func(ctx context.Context, fn func(store.CapturedFile) error) error
}

// HiddenStates is the manifest's section on the captured hidden states:
// totals, the layout every file has, and each file.
type HiddenStates struct {
	Dir    string `json:"dir"` // the capture folder, relative to the manifest
	Count  int    `json:"count"`
	Tokens int64  `json:"tokens"`
	Bytes  int64  `json:"bytes"`
	// Layers, Hidden and DType are the files' (hidden_states is [tokens,
	// layers, hidden] of dtype); DType is "mixed" when files differ.
	Layers   int               `json:"layers"`
	Hidden   int               `json:"hidden"`
	DType    string            `json:"dtype"`
	SumsFile string            `json:"sums_file"` // the sha256sum file, relative to the manifest
	Files    []HiddenStateFile `json:"files"`
}

// HiddenStateFile is one captured file: its capture key (the training
// row's id: the sample id, or "<id>/turn<k>" for a turn row), where it is
// and what it holds.
type HiddenStateFile struct {
	Key      string `json:"key"`
	SampleID string `json:"sample_id"`
	Turn     *int   `json:"turn,omitempty"` // 0-based turn index of a turn row; absent for a whole conversation
	Path     string `json:"path"`           // relative to the manifest
	Bytes    int64  `json:"bytes"`
	SHA256   string `json:"sha256"`
	Shape    [3]int `json:"shape"` // [tokens, layers, hidden]
	DType    string `json:"dtype"`
}

// hiddenStates reads every captured file's record into the manifest's
// section; nil when the export has no capture.
func hiddenStates(ctx context.Context, dir, name string, o Options) (*HiddenStates, error) {
	c := o.Captured
	if c == nil {
		return nil, nil
	}
	h := &HiddenStates{Dir: relFrom(dir, c.Dir), SumsFile: relFrom(dir, HiddenSumsPath(dir, name)), Files: []HiddenStateFile{}}
	err := c.Each(ctx, func(f store.CapturedFile) error {
		hf := HiddenStateFile{Key: f.Key, SampleID: f.SampleID, Path: relFrom(dir, recordedPath(o.JobDir, f.Path)),
			Bytes: f.Bytes, SHA256: f.SHA256, Shape: [3]int{f.Tokens, f.Layers, f.Hidden}, DType: f.DType}
		if f.Turn != store.WholeConversation {
			turn := f.Turn
			hf.Turn = &turn
		}
		if h.Count == 0 {
			h.Layers, h.Hidden, h.DType = f.Layers, f.Hidden, f.DType
		} else if h.Layers != f.Layers || h.Hidden != f.Hidden || h.DType != f.DType {
			h.Layers, h.Hidden, h.DType = 0, 0, "mixed"
		}
		h.Count++
		h.Tokens += int64(f.Tokens)
		h.Bytes += f.Bytes
		h.Files = append(h.Files, hf)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("manifest: captured files: %w", err)
	}
	return h, nil
}

// hiddenSums is the sha256sum file of h's files: "<sha256>  <path>" a line.
func hiddenSums(h *HiddenStates) []byte {
	var b strings.Builder
	for _, f := range h.Files {
		fmt.Fprintf(&b, "%s  %s\n", f.SHA256, f.Path)
	}
	return []byte(b.String())
}

// recordedPath is a captured file's record path made absolute: records
// are relative to the job file's folder, or absolute when outside it.
func recordedPath(jobDir, p string) string {
	p = filepath.FromSlash(p)
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(jobDir, p)
}

// relFrom is path relative to dir with slashes, "../" and all when it is
// outside: the capture folder need not be inside the export folder.
func relFrom(dir, path string) string {
	rel, err := filepath.Rel(dir, path)
	if err != nil {
		return filepath.ToSlash(path)
	}
	return filepath.ToSlash(rel)
}

// cardHiddenStates is the card's section on the captured hidden states:
// how many, their layout and size, how to load one and how to check them.
func cardHiddenStates(b *strings.Builder, m *Manifest) {
	h := m.HiddenStates
	if h == nil {
		return
	}
	b.WriteString("## Hidden states\n\n")
	fmt.Fprintf(b, "%d files of the target model's hidden states in `%s/` (%d tokens, %d bytes in all), one per captured row (a done conversation, or each turn row with `output.token_rows: turn`): ", h.Count, h.Dir, h.Tokens, h.Bytes)
	b.WriteString("the manifest's `hidden_states.files` maps each row (its `key`, the sample id or `<id>/turn<k>`) to its file, with the file's bytes, SHA-256 and shape.\n")
	if h.DType == "mixed" {
		b.WriteString("Each file holds `token_ids` (int64, [tokens]) and `hidden_states` ([tokens, layers, hidden]); the files differ in layers, hidden size or dtype (see each file's shape and dtype).\n\n")
	} else {
		fmt.Fprintf(b, "Each file holds `token_ids` (int64, [tokens]: the row's `input_ids`) and `hidden_states` (%s, [tokens, %d layers, %d hidden]).\n\n", h.DType, h.Layers, h.Hidden)
	}
	example := "<file>.safetensors"
	if len(h.Files) > 0 {
		example = h.Files[0].Path
	}
	fmt.Fprintf(b, "```python\nfrom safetensors.torch import load_file\n\nt = load_file(%q)\nids, hs = t[\"token_ids\"], t[\"hidden_states\"]\n```\n\n", example)
	fmt.Fprintf(b, "`sha256sum -c %s` run in this folder checks every file; `regen verify` checks them against the store too, and that the folder holds no file it does not list.\n\n", h.SumsFile)
}

// CapturedFor is the Options.Captured of a job: its capture folder and the
// store's records; nil when the job has no capture section.
func CapturedFor(spec *job.Spec, st store.Captures) *CapturedFiles {
	if spec.Capture == nil {
		return nil
	}
	return &CapturedFiles{Dir: spec.Capture.Dir, Each: st.EachCapturedFile}
}

// checkHiddenStates compares the manifest's list of captured files with
// the store's records (key, path, bytes, SHA-256; the files themselves are
// hashed by the capture's own verify): an export written before the
// capture finished, or a manifest edited since, is named. A non-zero since
// passes over files captured after it (the check at the end of an export
// while another worker of the job still captures).
func checkHiddenStates(ctx context.Context, dir, name string, m *Manifest, o Options, since time.Time) ([]Problem, error) {
	if o.Captured == nil {
		return nil, nil
	}
	where := filepath.Base(ManifestPath(dir, name))
	byKey := map[string]HiddenStateFile{}
	if m.HiddenStates != nil {
		for _, f := range m.HiddenStates.Files {
			byKey[f.Key] = f
		}
	}
	var out []Problem
	err := o.Captured.Each(ctx, func(rec store.CapturedFile) error {
		got, ok := byKey[rec.Key]
		delete(byKey, rec.Key)
		path := relFrom(dir, recordedPath(o.JobDir, rec.Path))
		switch {
		case !ok && !since.IsZero() && rec.CapturedAt.After(since):
		case !ok:
			out = append(out, Problem{Path: where, What: fmt.Sprintf("does not list the hidden states of %s (%s) the store records: exported before the capture finished", rec.Key, path)})
		case got.Path != path || got.Bytes != rec.Bytes || got.SHA256 != rec.SHA256:
			out = append(out, Problem{Path: where, What: fmt.Sprintf("lists %s as %s (%d bytes, %s), the store records %s (%d bytes, %s)", rec.Key, got.Path, got.Bytes, got.SHA256, path, rec.Bytes, rec.SHA256)})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("captured files: %w", err)
	}
	if m.HiddenStates != nil {
		for _, f := range m.HiddenStates.Files {
			if _, extra := byKey[f.Key]; extra {
				out = append(out, Problem{Path: where, What: fmt.Sprintf("lists hidden states of %s (%s) the store does not record", f.Key, f.Path)})
			}
		}
	}
	return out, nil
}
