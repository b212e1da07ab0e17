package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

// lockedBuffer collects log lines from the runner's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestBackupsKeepTheData runs one job twice on the simulator, whose answer
// to a prompt depends only on the prompt and max_tokens: once without
// escalation backups and once with every truncated short answer's
// escalation running as a backup (every prompt is claimed at once, so the
// store has no more short work from the start). Both store the same
// answers in the same lanes, each sample once, and the second run did
// store backup answers.
func TestBackupsKeepTheData(t *testing.T) {
	run := func(backupAt string) (map[string]string, string) {
		dir := t.TempDir()
		writePrompts(t, filepath.Join(dir, "prompts.jsonl"), 80)
		yaml := fmt.Sprintf(`name: b
model: sim-model
sources: [{partition: p, path: prompts.jsonl, prompt: prompt, id: id}]
lanes:
  - {name: short, concurrency: 100, max_tokens: 200, backup_at: %s}
  - {name: long, concurrency: 100, max_tokens: 3000}
server:
  engine: sim
  sim: {profile: fast, speed: 50, output_mean: 150, output_sigma: 1.0, seed: 7, load_time: 1s, warmup_time: 0s}
output: {formats: [sharegpt]}
quality: {truncated: false}
`, backupAt)
		spec := loadJobYAML(t, dir, yaml)
		st := openStore(t, spec)
		var logs lockedBuffer
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
		if _, err := Run(ctx, Options{Spec: spec, Store: st, Logger: logger, ProgressEvery: time.Hour, NoExport: true}); err != nil {
			t.Fatalf("run with backup_at %s: %v\n%s", backupAt, err, logs.String())
		}
		got := map[string]string{}
		err := st.Finished(ctx, func(r store.Row) error {
			var res llm.Result
			if err := json.Unmarshal(r.Result.Response, &res); err != nil {
				return err
			}
			if _, dup := got[r.ID]; dup {
				t.Errorf("backup_at %s: %s finished twice", backupAt, r.ID)
			}
			got[r.ID] = fmt.Sprintf("%s, %d attempt(s), %s: %.40s", r.Lane, r.Attempts, res.FinishReason, res.Content)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return got, logs.String()
	}

	plain, plainLog := run("0")
	backed, backedLog := run("0.3")
	if len(plain) != 80 {
		t.Fatalf("without backups: %d samples finished, want 80", len(plain))
	}
	if diff := cmp.Diff(plain, backed); diff != "" {
		t.Errorf("stored answers without backups (-) and with (+):\n%s", diff)
	}
	escalated := slices.DeleteFunc(slices.Collect(maps.Values(plain)), func(s string) bool { return !strings.HasPrefix(s, "long") })
	if len(escalated) == 0 {
		t.Fatalf("no sample escalated; the job must truncate some short answers")
	}
	if strings.Contains(plainLog, "backup started") {
		t.Errorf("backup_at 0 started backups")
	}
	stored := strings.Count(backedLog, "backup answer stored")
	if stored == 0 || stored > len(escalated) {
		t.Errorf("%d backup answers stored, want 1 to %d (the escalated samples)\n%s", stored, len(escalated), backedLog)
	}
	t.Logf("%d of 80 samples escalated; %d backups started, %d of their answers stored", len(escalated), strings.Count(backedLog, "backup started"), stored)
}
