package job

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite golden files")

func fingerprintOf(t *testing.T, path string, src []byte) Fingerprint {
	t.Helper()
	s, err := Parse(path, src)
	if err != nil {
		t.Fatalf("Parse %s: %v", path, err)
	}
	fp, err := s.Fingerprint()
	if err != nil {
		t.Fatalf("Fingerprint %s: %v", path, err)
	}
	return fp
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The fingerprint of a job file is pinned by a golden file: a change to
// what it covers or how it is written shows here, because it would make
// every existing store refuse its own job.
func TestFingerprintGolden(t *testing.T) {
	fp := fingerprintOf(t, "testdata/fingerprint/base.yaml", readFile(t, "testdata/fingerprint/base.yaml"))
	got := string(fp.Canonical) + "\n" + fp.Hash + "\n"
	golden := "testdata/fingerprint/base.golden"
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(string(readFile(t, golden)), got); diff != "" {
		t.Errorf("fingerprint of base.yaml (-golden +got):\n%s", diff)
	}
}

// Stable across runs, hosts and key order: the same job read from two
// directories, with every mapping's keys reordered and settings that
// cannot change an answer changed, has one fingerprint.
func TestFingerprintStable(t *testing.T) {
	base := readFile(t, "testdata/fingerprint/base.yaml")
	want := fingerprintOf(t, "testdata/fingerprint/base.yaml", base)
	cases := []struct {
		name, path string
		src        []byte
	}{
		{"again", "testdata/fingerprint/base.yaml", base},
		{"other host and directory", filepath.Join(t.TempDir(), "jobs", "job.yaml"), base},
		{"keys reordered, non-answer settings changed", "testdata/fingerprint/reordered.yaml", readFile(t, "testdata/fingerprint/reordered.yaml")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := fingerprintOf(t, tc.path, tc.src)
			if got.Hash != want.Hash {
				t.Errorf("hash = %s, want %s\ncanonical: %s\nwant:      %s", got.Hash, want.Hash, got.Canonical, want.Canonical)
			}
		})
	}
}

// Every setting that can change an answer changes the fingerprint, and
// the difference names it; settings that cannot leave it as it was.
func TestFingerprintDiff(t *testing.T) {
	base := string(readFile(t, "testdata/fingerprint/base.yaml"))
	from := fingerprintOf(t, "job.yaml", []byte(base))
	cases := []struct {
		name     string
		old, new string // replaced in base.yaml
		want     []string
	}{
		{"temperature", "temperature: 0.7", "temperature: 1.3", []string{"generation.temperature: 0.7 -> 1.3"}},
		{"model", "model: sim-model", "model: other-model", []string{"model: sim-model -> other-model"}},
		{"max_tokens", "max_tokens: 2000", "max_tokens: 500", []string{"lanes.short.max_tokens: 2000 -> 500"}},
		{"top_p added", "temperature: 0.7", "temperature: 0.7\n  top_p: 0.9", []string{"generation.top_p: (unset) -> 0.9"}},
		{"nested extra", "presence: 0.1", "presence: 0.5", []string{"generation.extra.penalties.presence: 0.1 -> 0.5"}},
		{"template kwargs", "enable_thinking: true", "enable_thinking: false",
			[]string{"generation.chat_template_kwargs.enable_thinking: true -> false"}},
		{"reasoning mode", "temperature: 0.7", "temperature: 0.7\n  reasoning: keep", []string{"generation.reasoning: strip_history -> keep"}},
		{"regenerate mode", "system: be brief", "system: be brief\n    regenerate: last", []string{"sources.chats.regenerate: all -> last"}},
		{"samples per prompt", "system: be brief", "system: be brief\n    samples_per_prompt: 3", []string{"sources.chats.samples_per_prompt: (unset) -> 3"}},
		{"system prompt", "system: be brief", "system: be concise", []string{`sources.chats.system: "be brief" -> "be concise"`}},
		{"mapping", "prompt: text", "prompt: question", []string{"sources.prompts.prompt: text -> question"}},
		{"lane assignment", "max_prompt_tokens: 1000", "max_prompt_tokens: 4000",
			[]string{"lane_of.chats[0].up_to: 1000 -> 4000", "lane_of.prompts[0].up_to: 1000 -> 4000"}},
		{"escalation", "max_tokens: 16000", "max_tokens: 1000", []string{
			"lanes.long.escalate_to: (unset) -> short", "lanes.long.max_tokens: 16000 -> 1000", "lanes.short.escalate_to: long -> (unset)"}},
		{"quality rule", `pattern: "(?i)as an ai"`, `pattern: "(?i)as a language model"`,
			[]string{`quality.regex.refusal.pattern: "(?i)as an ai" -> "(?i)as a language model"`}},
		{"quality switch", "quality:\n", "quality:\n  truncated: false\n", []string{"quality.truncated: true -> false"}},
		// Not an answer: no difference.
		{"concurrency", "concurrency: 8", "concurrency: 16", nil},
		{"endpoint", "30000", "30001", nil},
		{"source path", "data/p.jsonl", "data/q.jsonl", nil},
		{"timeouts", "temperature: 0.7", "temperature: 0.7\n  request_timeout: 1m\n  idle_timeout: 10s", nil},
		{"output and monitor", "endpoints:", "output: {formats: [parquet], metadata: full}\nmonitor: {stall_after: 1m}\nstore: {dsn: x.db}\nendpoints:", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(base, tc.old) {
				t.Fatalf("base.yaml has no %q", tc.old)
			}
			to := fingerprintOf(t, "job.yaml", []byte(strings.Replace(base, tc.old, tc.new, 1)))
			got, err := ConfigDiff(from.Canonical, to.Canonical)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ConfigDiff (-want +got):\n%s", diff)
			}
			if same := from.Hash == to.Hash; same != (len(tc.want) == 0) {
				t.Errorf("hash unchanged = %v, want %v", same, len(tc.want) == 0)
			}
		})
	}
}

func TestLaneRanges(t *testing.T) {
	s := &Spec{
		Sources: []Source{{Partition: "pinned", Lane: "big"}, {Partition: "listed"}, {Partition: "free"}},
		Lanes: []Lane{
			{Name: "tiny", MaxPromptTokens: 100},
			{Name: "small", MaxPromptTokens: 2000},
			{Name: "big", Partitions: []string{"listed"}},
			{Name: "rest"},
		},
	}
	cases := []struct {
		partition string
		want      []LaneRange
	}{
		{"pinned", []LaneRange{{"pinned", 0, 0, "big"}}},
		{"listed", []LaneRange{{"listed", 0, 0, "big"}}},
		{"free", []LaneRange{{"free", 0, 100, "tiny"}, {"free", 101, 2000, "small"}, {"free", 2001, 0, "rest"}}},
	}
	for _, tc := range cases {
		got := s.LaneRanges(tc.partition)
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("LaneRanges(%s) (-want +got):\n%s", tc.partition, diff)
		}
		// The ranges are LaneFor.
		for _, r := range got {
			for _, n := range []int{r.MinTokens, r.MaxTokens, r.MinTokens + 1} {
				if r.MaxTokens == 0 && n == 0 || r.MaxTokens > 0 && n > r.MaxTokens {
					continue
				}
				if lane := s.LaneFor(tc.partition, n); lane != r.Lane {
					t.Errorf("LaneFor(%s, %d) = %s, range says %s", tc.partition, n, lane, r.Lane)
				}
			}
		}
	}
}
