package fleet

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/probe"
)

const startJob = `name: start
model: Qwen/Qwen3-8b
endpoints:
  - {url: "http://127.0.0.1:1", engine: vllm}
  - {url: "http://127.0.0.1:2", engine: vllm, api_key_env: MY_KEY}
sources: [{partition: p, path: prompts.jsonl, prompt: prompt, id: id}]
monitor: {start_deadline: 30s}
`

// TestStartVerdict: the run stops when every endpoint refuses the job's
// configuration, or when none answered by start_deadline, with the job
// file's lines; one endpoint that answers or is not refused keeps it going.
func TestStartVerdict(t *testing.T) {
	spec, err := job.Parse("/jobs/job.yaml", []byte(startJob))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	refused := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	tests := []struct {
		name     string
		at       time.Duration
		refusals map[string]string
		answered []string
		want     []string // "" = no verdict
	}{
		{"nothing yet", time.Second, nil, nil, nil},
		{"one refused, one not", time.Second, map[string]string{"http://127.0.0.1:1": "serves x"}, nil, nil},
		{"every endpoint refused", time.Second,
			map[string]string{"http://127.0.0.1:1": "serves x; set model: at job.yaml:2", "http://127.0.0.1:2": "refuses the job's credentials"},
			nil, []string{"every endpoint refuses the job's configuration: http://127.0.0.1:1: serves x; set model: at job.yaml:2; http://127.0.0.1:2: refuses"}},
		{"none answered by the deadline", 31 * time.Second, nil, nil,
			[]string{"no endpoint answered in the 30s since the run started (monitor.start_deadline at job.yaml:7)",
				"http://127.0.0.1:1: never answered since the run started: is the url right? (endpoints[0].url at job.yaml:4); last error: dial tcp",
				"http://127.0.0.1:2: never answered since the run started: is the url right? (endpoints[1].url at job.yaml:5)"}},
		{"one answered", 31 * time.Second, nil, []string{"http://127.0.0.1:2"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &Fleet{cfg: Config{Spec: spec}, keeper: newProbeFleet(spec, nil, nil), refusals: map[string]string{}, start: newStartState(t0)}
			for u, r := range tt.refusals {
				f.refusals[u] = r
			}
			f.start.probed("http://127.0.0.1:1", probe.Snapshot{HealthErr: refused})
			for _, u := range tt.answered {
				f.start.probed(u, probe.Snapshot{HealthStatus: 503})
			}
			err := f.startVerdict(t0.Add(tt.at))
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("verdict = %v, want none", err)
				}
				return
			}
			var re *RefusedError
			if !errors.As(err, &re) {
				t.Fatalf("verdict = %v, want a RefusedError", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("verdict does not say %q:\n%v", w, err)
				}
			}
		})
	}
}
