package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
)

// recordCaptures writes a stand-in hidden-state file for each of the
// first n done samples into the job's capture folder and records it in the
// store under a lease, as the capture loop does.
func recordCaptures(t *testing.T, jobPath string, n int) *job.Spec {
	t.Helper()
	ctx := context.Background()
	spec, err := job.Load(jobPath)
	if err != nil {
		t.Fatal(err)
	}
	st, err := openExisting(ctx, spec, "")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := os.MkdirAll(spec.Capture.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		k := store.CaptureKey{Key: fmt.Sprint(i), SampleID: fmt.Sprint(i), Turn: store.WholeConversation, Input: sampleInput(fmt.Sprint(i))}
		c, ok, err := st.ClaimCapture(ctx, k, "me", time.Minute)
		if err != nil || !ok {
			t.Fatalf("claim capture %s: %v %v", k.Key, ok, err)
		}
		body := bytes.Repeat([]byte{byte('a' + i)}, 4096+i)
		path := filepath.Join(spec.Capture.Dir, "s"+k.Key+".safetensors")
		if err := os.WriteFile(path, body, 0o644); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(body)
		if err := st.RecordCapture(ctx, c, store.CapturedFile{CaptureKey: k, Path: spec.Rel(path), Bytes: int64(len(body)),
			SHA256: hex.EncodeToString(sum[:]), Tokens: 300, Layers: 2, Hidden: 64, DType: "bf16"}); err != nil {
			t.Fatal(err)
		}
	}
	return spec
}

// TestVerifyCapturedFiles: regen verify on a job with captured files
// exits 0 when every file matches the store and the manifest, and the
// export's sha256sum file passes `sha256sum -c` in the export folder; a
// flipped byte, a stray .safetensors file and a capture recorded after
// the export each make it exit 1 naming the first mismatch.
func TestVerifyCapturedFiles(t *testing.T) {
	ctx := context.Background()
	jobPath := planCaptureJob(t, "hidden_states", 4)
	spec := recordCaptures(t, jobPath, 3)
	if err := runExport(ctx, &bytes.Buffer{}, jobPath, exportOptions{}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := runVerify(ctx, &out, jobPath, verifyOptions{}); err != nil || !strings.Contains(out.String(), "3 hidden-state files (12 kB) match the store") {
		t.Fatalf("verify: %v\n%s", err, out.String())
	}
	sums := exec.Command("sha256sum", "-c", "cap.hidden_states.sha256")
	sums.Dir = spec.Output.Dir
	if b, err := sums.CombinedOutput(); err != nil || strings.Count(string(b), ": OK") != 3 {
		t.Fatalf("sha256sum -c in %s: %v\n%s", spec.Output.Dir, err, b)
	}
	damage := []struct {
		name string
		do   func()
		want string
	}{
		{"flipped byte", func() {
			p := filepath.Join(spec.Capture.Dir, "s1.safetensors")
			b, _ := os.ReadFile(p)
			b[100] ^= 0xff
			os.WriteFile(p, b, 0o644)
		}, "hidden_states/s1.safetensors: SHA-256 "},
		{"stray file", func() {
			os.WriteFile(filepath.Join(spec.Capture.Dir, "s1.safetensors"), bytes.Repeat([]byte{'b'}, 4097), 0o644) // repaired
			os.WriteFile(filepath.Join(spec.Capture.Dir, "zz.safetensors"), []byte("half"), 0o644)
		}, "hidden_states/zz.safetensors: in the capture folder but not recorded in the store"},
		{"captured after the export", func() {
			os.Remove(filepath.Join(spec.Capture.Dir, "zz.safetensors"))
			recordCapturesFrom(t, jobPath, 3)
		}, "cap.manifest.json: does not list the hidden states of 3 (../hidden_states/s3.safetensors) the store records"},
	}
	for _, d := range damage {
		d.do()
		out.Reset()
		err := runVerify(ctx, &out, jobPath, verifyOptions{})
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(err.Error()+out.String(), d.want) {
			t.Fatalf("%s: verify error %v, want exit 1 naming %q; output:\n%s", d.name, err, d.want, out.String())
		}
	}
}

// recordCapturesFrom records sample from's capture (one past those
// recordCaptures made).
func recordCapturesFrom(t *testing.T, jobPath string, from int) {
	t.Helper()
	ctx := context.Background()
	spec, _ := job.Load(jobPath)
	st, err := openExisting(ctx, spec, "")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	k := store.CaptureKey{Key: fmt.Sprint(from), SampleID: fmt.Sprint(from), Turn: store.WholeConversation, Input: sampleInput(fmt.Sprint(from))}
	c, ok, err := st.ClaimCapture(ctx, k, "me", time.Minute)
	if err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	body := []byte("late")
	path := filepath.Join(spec.Capture.Dir, "s"+k.Key+".safetensors")
	if err := os.WriteFile(path, body, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(body)
	if err := st.RecordCapture(ctx, c, store.CapturedFile{CaptureKey: k, Path: spec.Rel(path), Bytes: 4, SHA256: hex.EncodeToString(sum[:]), Tokens: 1, Layers: 2, Hidden: 64, DType: "bf16"}); err != nil {
		t.Fatal(err)
	}
}

// TestStatusShowsCapture: regen status reads the capture's progress from
// the store (the counts of its table, the total its walk recorded) into
// the text and the JSON; a job without a capture section has "capture":
// null.
func TestStatusShowsCapture(t *testing.T) {
	ctx := context.Background()
	jobPath := planCaptureJob(t, "hidden_states", 4)
	spec := recordCaptures(t, jobPath, 3)
	st, err := openExisting(ctx, spec, "")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.SetMeta(ctx, monitor.CaptureRowsMeta, "4", true); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	_ = writeStatus(ctx, &out, spec, st, time.Now(), "", false) // no runner ever beat: exit 2, the text is what counts
	if want := "hidden states: 3 of 4 captured (75.0%), 0 dead, 0 in flight; 12 kB, 900 tokens"; !strings.Contains(out.String(), want) {
		t.Errorf("status text lacks %q:\n%s", want, out.String())
	}
	out.Reset()
	_ = writeStatus(ctx, &out, spec, st, time.Now(), "", true)
	var doc struct {
		Capture *monitor.CaptureProgress `json:"capture"`
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if c := doc.Capture; c == nil || c.Total == nil || *c.Total != 4 || c.Captured != 3 || c.Bytes != 4096+4097+4098 || c.Tokens != 900 {
		t.Errorf("status --json capture = %+v", doc.Capture)
	}
	spec.Capture = nil
	out.Reset()
	_ = writeStatus(ctx, &out, spec, st, time.Now(), "", true)
	if !strings.Contains(out.String(), `"capture": null`) {
		t.Errorf("status --json of a job without capture lacks \"capture\": null")
	}
}
