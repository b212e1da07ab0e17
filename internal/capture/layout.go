package capture

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/plan"
	"github.com/regen-dev/regen/internal/store"
)

// DefaultLayers is the number of layers assumed when neither the job nor
// a captured file says: EAGLE-3 trains on three auxiliary layers of the
// target model and its last one (vLLM's extract_hidden_states example
// asks for four layer ids).
const DefaultLayers = 4

// ErrNoLayout says the hidden size is unknown: no capture.hidden, no file
// captured yet and no readable config.json for the model.
var ErrNoLayout = errors.New("hidden size unknown: set capture.hidden (or capture once, or give the model as a local folder with config.json)")

// LayoutFor is what each token of a job's capture takes: the job's
// capture.layers/hidden/dtype where set, else the first captured file's
// (the server's truth), else the model's config.json (hidden_size and
// torch_dtype, read when the job's model or server --model-path is a local
// file or folder) with DefaultLayers. Source names each origin. caps may
// be nil (the job has no store yet).
func LayoutFor(ctx context.Context, caps store.Captures, spec *job.Spec) (Layout, error) {
	c := spec.Capture
	l := Layout{Layers: c.Layers, Hidden: c.Hidden, DType: c.DType}
	var src []string
	if l.Layers > 0 || l.Hidden > 0 || l.DType != "" {
		src = append(src, "the job's capture section")
	}
	if caps != nil && (l.Layers == 0 || l.Hidden == 0 || l.DType == "") {
		f, ok, err := firstCaptured(ctx, caps)
		if err != nil {
			return l, err
		}
		if ok {
			l.Layers, l.Hidden, l.DType = cmpOr(l.Layers, f.Layers), cmpOr(l.Hidden, f.Hidden), cmpOrS(l.DType, f.DType)
			src = append(src, "the captured files")
		}
	}
	if l.Hidden == 0 || l.DType == "" {
		if path := modelConfigPath(spec); path != "" {
			if m, err := plan.LoadModelConfig(path); err == nil {
				d, _ := NormalizeDType(m.Dtype)
				l.Hidden, l.DType = cmpOr(l.Hidden, m.HiddenSize), cmpOrS(l.DType, d)
				src = append(src, spec.Rel(path))
			}
		}
	}
	if l.Layers == 0 {
		l.Layers = DefaultLayers
		src = append(src, fmt.Sprintf("%d layers assumed (EAGLE-3's three auxiliary and the last; set capture.layers)", DefaultLayers))
	}
	if l.DType == "" {
		l.DType = "bf16"
		src = append(src, "bf16 assumed")
	}
	l.Source = joinSources(src)
	if l.Hidden == 0 {
		return l, ErrNoLayout
	}
	return l, nil
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

func cmpOrS(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func joinSources(s []string) string {
	out := ""
	for i, p := range s {
		if i > 0 {
			out += "; "
		}
		out += p
	}
	return out
}

// errFirst stops EachCapturedFile at its first file.
var errFirst = errors.New("first file")

func firstCaptured(ctx context.Context, caps store.Captures) (store.CapturedFile, bool, error) {
	var first store.CapturedFile
	err := caps.EachCapturedFile(ctx, func(f store.CapturedFile) error {
		first = f
		return errFirst
	})
	switch {
	case errors.Is(err, errFirst):
		return first, true, nil
	case err != nil:
		return first, false, fmt.Errorf("read captured files: %w", err)
	}
	return first, false, nil
}

// modelConfigPath is the model's config.json when the job names the model
// by a local path (server --model-path, else the job's model): a
// config.json file, or a folder holding one. "" when there is none.
func modelConfigPath(spec *job.Spec) string {
	model := spec.Model
	if spec.Server != nil {
		for i, a := range spec.Server.Args {
			if a == "--model-path" && i+1 < len(spec.Server.Args) {
				model = spec.Server.Args[i+1]
			}
		}
	}
	if model == "" {
		return ""
	}
	if !filepath.IsAbs(model) {
		model = filepath.Join(spec.Dir, model)
	}
	if fi, err := os.Stat(model); err == nil && fi.IsDir() {
		model = filepath.Join(model, "config.json")
	}
	if fi, err := os.Stat(model); err == nil && fi.Mode().IsRegular() {
		return model
	}
	return ""
}

// EstimateJob estimates the storage spec's capture writes into its
// capture.dir, from st: every done sample's captures (turn rows with
// output.token_rows: turn), less the files already captured of a current
// row's ids (a stale one is captured again), with the folder's free space. It does not judge; Check (or Fits) does.
func EstimateJob(ctx context.Context, st Store, spec *job.Spec) (Estimate, error) {
	l, err := LayoutFor(ctx, st, spec)
	if err != nil {
		return Estimate{Layout: l}, err
	}
	perTurn := spec.Output.TokenRows == job.TokenRowsTurn
	e, err := EstimateStore(ctx, st, perTurn, l)
	if err != nil {
		return e, err
	}
	if e.Captured, e.CapturedBytes, err = currentCaptured(ctx, st, perTurn); err != nil {
		return e, fmt.Errorf("estimate capture storage: %w", err)
	}
	e.Dir = spec.Rel(spec.Capture.Dir)
	return e.Measure(spec.Capture.Dir)
}

// Preflight is the check a capture runs before it sends anything: the
// estimate for spec, and a *SpaceError when the files still to write, with
// the MarginPercent margin, do not fit in capture.dir's free space. An
// unknown hidden size (ErrNoLayout) is no refusal: the estimate is
// returned with it, and the first file fixes the layout.
func Preflight(ctx context.Context, st Store, spec *job.Spec) (Estimate, error) {
	e, err := EstimateJob(ctx, st, spec)
	if err != nil {
		return e, err
	}
	return e, e.Refusal()
}

// currentCaptured counts the recorded files of st that hold a current
// training row's ids (its key and input hash): those a capture keeps.
// Nothing is read when nothing is captured.
func currentCaptured(ctx context.Context, st Store, perTurn bool) (int, int64, error) {
	c, err := st.CaptureCounts(ctx)
	if err != nil || c.Captured == 0 {
		return 0, 0, err
	}
	inputs := map[string]string{}
	err = st.Finished(ctx, func(row store.Row) error {
		if row.State != store.Done {
			return nil
		}
		items, _, err := rowItems(row, perTurn)
		if err != nil {
			return nil // no ids to keep a file for: the capture walks past it too
		}
		for _, it := range items {
			inputs[it.Key] = it.Input
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	n, bytes := 0, int64(0)
	err = st.EachCapturedFile(ctx, func(f store.CapturedFile) error {
		if in, ok := inputs[f.Key]; ok && in == f.Input {
			n++
			bytes += f.Bytes
		}
		return nil
	})
	return n, bytes, err
}
