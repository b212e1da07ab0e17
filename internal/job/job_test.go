package job

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func ptr[T any](v T) *T { return &v }

func abs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// errLines splits a joined Load error into its messages.
func errLines(err error) []string {
	if err == nil {
		return nil
	}
	var out []string
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			out = append(out, e.Error())
		}
		return out
	}
	return []string{err.Error()}
}

func TestLoadFull(t *testing.T) {
	got, err := Load("testdata/full.yaml")
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	dir := abs(t, "testdata")
	want := &Spec{
		Name:  "full job",
		Model: "m1",
		Sources: []Source{
			{Partition: "a", Path: filepath.Join(dir, "data/a.jsonl"), Messages: "messages", Tools: "tools", ID: "id", Limit: 10, Lane: "big", Regenerate: "last", SamplesPerPrompt: 4},
			{Partition: "b", Path: "/abs/b/*.parquet", Format: "parquet", Prompt: "text", System: "be brief", Regenerate: "all", SamplesPerPrompt: 1},
			{Partition: "c", Path: filepath.Join(dir, "data/glaive.jsonl"), Preset: "glaive", ID: "id", Regenerate: "all",
				Conversations: "conversations", Tools: "tools", SystemField: "system", StripSystemPrefix: "SYSTEM:", SamplesPerPrompt: 1},
		},
		Lanes: []Lane{
			{Name: "small", Concurrency: 8, MaxTokens: 1024, MaxPromptTokens: 2000, BackupAt: 0.6},
			{Name: "big", Concurrency: 2, MaxTokens: 8192, Partitions: []string{"b"}, BackupAt: 0},
		},
		Generation: Generation{
			Temperature:        ptr(0.5),
			TopP:               ptr(0.9),
			ChatTemplateKwargs: map[string]any{"enable_thinking": false},
			Extra:              map[string]any{"top_k": uint64(20), "stop": []any{"</s>"}},
			RequestTimeout:     10 * time.Minute,
			IdleTimeout:        45 * time.Second,
			HeaderTimeout:      20 * time.Second,
			Reasoning:          "keep",
		},
		Endpoints: []Endpoint{
			{URL: "http://127.0.0.1:30000", APIKeyEnv: "MY_KEY", Engine: "sglang", Detect: true},
			{URL: "https://gpu.example.com", Engine: "vllm"}, // the file's /v1 is dropped: regen adds it
		},
		Store:  Store{DSN: "sqlite:" + filepath.Join(dir, "state/full.db")},
		Output: Output{Dir: "/tmp/out", Formats: []string{"openai-batch", "parquet"}, Metadata: "full", TokenRows: "conversation"},
		Retry:  Retry{MaxAttempts: 3, BaseDelay: time.Second, MaxDelay: time.Minute, BrokenStreak: 10}, // poison_after: 0 leaves the burn guard on
		Quality: Quality{Truncated: true, Empty: true, Reasoning: true, ToolArgs: true, ToolName: true,
			Repetition: Repetition{NGram: 8},
			Regex: []RegexRule{{Name: "refusal", Pattern: "(?i)as an ai language model", Field: "content"},
				{Name: "regex1", Pattern: "^Sure!", Field: "any"}}},
		Alerts:  Alerts{Command: []string{"echo", "alert"}, Webhook: "https://hooks.example.com/x"},
		Monitor: Monitor{HeartbeatEvery: time.Second, DeadAfter: 10 * time.Second, StallAfter: 30 * time.Second, HangAfter: 30 * time.Second, ProbeEvery: 5 * time.Second, BrokenAfter: 10 * time.Minute, StartDeadline: 30 * time.Minute},
		Path:    "testdata/full.yaml",
		Dir:     dir,
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreUnexported(Spec{}, Lane{}, ConcurrencyValue{})); diff != "" {
		t.Errorf("Load(full.yaml) mismatch (-want +got):\n%s", diff)
	}
	if p, ok := got.Store.SQLitePath(); !ok || p != filepath.Join(dir, "state/full.db") {
		t.Errorf("SQLitePath() = %q, %v; want %q, true", p, ok, filepath.Join(dir, "state/full.db"))
	}
}

// defaultQuality is the quality block a job file that says nothing gets.
var defaultQuality = Quality{Truncated: true, Empty: true, Reasoning: true, ThinkTags: true, ToolArgs: true, ToolName: true,
	Repetition: Repetition{NGram: 10, MaxRepeats: 20}}

func TestLoadDefaults(t *testing.T) {
	dir := abs(t, "testdata")
	tests := []struct {
		file string
		want *Spec
	}{
		{
			file: "minimal.yaml",
			want: &Spec{
				Name:       "min/job",
				Sources:    []Source{{Partition: "p", Path: filepath.Join(dir, "p.jsonl"), Prompt: "q", Regenerate: "all", SamplesPerPrompt: 1}},
				Lanes:      []Lane{{Name: "default", Concurrency: 64, MaxTokens: 4096, BackupAt: DefaultBackupAt}},
				Generation: Generation{RequestTimeout: 30 * time.Minute, IdleTimeout: 120 * time.Second, HeaderTimeout: 20 * time.Second, Reasoning: "strip_history"},
				Endpoints:  []Endpoint{{URL: "http://localhost:8000", Engine: "sglang", Detect: true}},
				Store:      Store{DSN: filepath.Join(dir, "min_job.db")},
				Output:     Output{Dir: filepath.Join(dir, "out"), Formats: []string{"sharegpt"}, Metadata: "minimal", TokenRows: "conversation"},
				Retry:      Retry{MaxAttempts: 5, BaseDelay: 2 * time.Second, MaxDelay: 5 * time.Minute, PoisonAfter: 10, BrokenStreak: 10},
				Quality:    defaultQuality,
				Monitor:    Monitor{HeartbeatEvery: 2 * time.Second, DeadAfter: 15 * time.Second, StallAfter: 60 * time.Second, HangAfter: 30 * time.Second, ProbeEvery: 5 * time.Second, BrokenAfter: 10 * time.Minute, StartDeadline: 30 * time.Minute},
				Path:       "testdata/minimal.yaml",
				Dir:        dir,
			},
		},
		{
			file: "sim_server.yaml",
			want: &Spec{
				Name:       "s",
				Sources:    []Source{{Partition: "p", Path: filepath.Join(dir, "p.jsonl"), Conversations: "conversations", Regenerate: "all", SamplesPerPrompt: 1}},
				Lanes:      []Lane{{Name: "only", Concurrency: 64, MaxTokens: 4096, BackupAt: DefaultBackupAt}},
				Generation: Generation{RequestTimeout: 30 * time.Minute, IdleTimeout: 120 * time.Second, HeaderTimeout: 20 * time.Second, Reasoning: "strip_history"},
				Server: &Server{
					Engine: "sim", Host: "127.0.0.1", Port: 0,
					ReadyTimeout: 60 * time.Second, HangTimeout: 30 * time.Second,
					Restart: Restart{Max: 5, Window: 30 * time.Minute, Backoff: 5 * time.Second},
				},
				Store:   Store{DSN: filepath.Join(dir, "s.db")},
				Output:  Output{Dir: filepath.Join(dir, "out"), Formats: []string{"sharegpt"}, Metadata: "minimal", TokenRows: "conversation"},
				Retry:   Retry{MaxAttempts: 5, BaseDelay: 2 * time.Second, MaxDelay: 5 * time.Minute, PoisonAfter: 10, BrokenStreak: 10},
				Quality: defaultQuality,
				Monitor: Monitor{HeartbeatEvery: 2 * time.Second, DeadAfter: 15 * time.Second, StallAfter: 60 * time.Second, HangAfter: 30 * time.Second, ProbeEvery: 5 * time.Second, BrokenAfter: 10 * time.Minute, StartDeadline: 30 * time.Minute},
				Path:    "testdata/sim_server.yaml",
				Dir:     dir,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			got, err := Load(filepath.Join("testdata", tt.file))
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if diff := cmp.Diff(tt.want, got, cmpopts.IgnoreUnexported(Spec{}, Lane{}, ConcurrencyValue{})); diff != "" {
				t.Errorf("Load(%s) mismatch (-want +got):\n%s", tt.file, diff)
			}
		})
	}
}

func TestServerEngineDefaults(t *testing.T) {
	src := "name: r\nsources: [{partition: p, path: p.jsonl, prompt: q}]\nserver: {args: [--tp, '8']}\n"
	s, err := Parse("job.yaml", []byte(src))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want := &Server{
		Engine: "sglang", Args: []string{"--tp", "8"}, Host: "127.0.0.1", Port: 30000,
		ReadyTimeout: 30 * time.Minute, HangTimeout: 30 * time.Second,
		Restart: Restart{Max: 5, Window: 30 * time.Minute, Backoff: 5 * time.Second},
	}
	if diff := cmp.Diff(want, s.Server); diff != "" {
		t.Errorf("server defaults mismatch (-want +got):\n%s", diff)
	}
}

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		file string
		want []string
	}{
		{"broken_streak_invalid.yaml", []string{
			`testdata/broken_streak_invalid.yaml:6: retry.broken_streak: must be >= 0 (0 turns the guard off)`,
		}},
		{"samples_invalid.yaml", []string{
			`testdata/samples_invalid.yaml:6: sources[0].samples_per_prompt: must be >= 1`,
			`testdata/samples_invalid.yaml:10: sources[1].samples_per_prompt: 3 answers per prompt need a seed per sample; remove generation.extra.seed`,
		}},
		{"invalid.yaml", []string{
			`testdata/invalid.yaml:1: name: required`,
			`testdata/invalid.yaml:3: sources[0]: set exactly one of conversations, messages or prompt (got 2)`,
			`testdata/invalid.yaml:7: sources[0].lane: no lane named "nope"`,
			`testdata/invalid.yaml:8: sources[1].partition: "a" is also the name of sources[0]`,
			`testdata/invalid.yaml:8: sources[1].path: required`,
			`testdata/invalid.yaml:9: sources[1].format: unknown format "csv" (want jsonl or parquet (gzip is read by the .gz extension), or leave it out to go by extension)`,
			`testdata/invalid.yaml:11: sources[1].limit: must be >= 0`,
			`testdata/invalid.yaml:12: sources[2].partition: required`,
			`testdata/invalid.yaml:12: sources[2]: set exactly one of conversations, messages or prompt (got 0)`,
			`testdata/invalid.yaml:15: lanes[0].concurrency: must be > 0 (or auto)`,
			`testdata/invalid.yaml:17: lanes[0].backup_at: must be >= 0 and < 1 (a share of max_tokens; 0 = no backups)`,
			`testdata/invalid.yaml:18: lanes[1].name: "x" is also the name of lanes[0]`,
			`testdata/invalid.yaml:20: lanes[1].concurrency: must be > 0 (or auto)`,
			`testdata/invalid.yaml:19: lanes[1].max_tokens: must be > 0`,
			`testdata/invalid.yaml:22: lanes[1].max_prompt_tokens: must be >= 0`,
			`testdata/invalid.yaml:21: lanes[1].partitions[1]: no source has partition "zz"`,
			`testdata/invalid.yaml:24: generation.temperature: must be between 0 and 2`,
			`testdata/invalid.yaml:25: generation.top_p: must be > 0 and <= 1`,
			`testdata/invalid.yaml:26: generation.request_timeout: must be > 0`,
			`testdata/invalid.yaml:28: generation.extra.model: is set by regen and cannot be overridden`,
			`testdata/invalid.yaml:29: generation.extra.stream: is set by regen and cannot be overridden`,
			`testdata/invalid.yaml:31: endpoints[0].url: "ftp://host/x": want an http:// or https:// URL`,
			`testdata/invalid.yaml:33: endpoints[0].engine: unknown engine "tgi" (want sglang, vllm, llamacpp, sim)`,
			`testdata/invalid.yaml:32: endpoints[0].api_key_env: looks like a key, not a variable name: put the key in an environment variable and name the variable here`,
			`testdata/invalid.yaml:35: endpoints[1].api_key_env: "MY-KEY" is not an environment variable name (letters, digits and _)`,
			`testdata/invalid.yaml:36: endpoints[2].url: required`,
			`testdata/invalid.yaml:36: endpoints[2].api_key_env: looks like a key, not a variable name: put the key in an environment variable and name the variable here`,
			`testdata/invalid.yaml:38: store.dsn: holds a password; put it in PGPASSWORD or a PGPASSFILE (or the whole DSN in REGEN_STORE), never in the job file`,
			`testdata/invalid.yaml:40: output.formats[1]: unknown format "csv" (want sharegpt, openai-batch, parquet)`,
			`testdata/invalid.yaml:40: output.formats[2]: "sharegpt" listed twice`,
			`testdata/invalid.yaml:42: retry.max_attempts: must be >= 1`,
			`testdata/invalid.yaml:44: retry.max_delay: must be >= base_delay (10s)`,
			`testdata/invalid.yaml:49: monitor.dead_after: must be longer than heartbeat_every (5s)`,
			`testdata/invalid.yaml:46: alerts.webhook: "mailto:x@y": want an http:// or https:// URL`,
		}},
		{"both.yaml", []string{
			`testdata/both.yaml:4: endpoints: set either endpoints or server, not both (with server, the launched server is the endpoint)`,
			`testdata/both.yaml:8: server.port: must be 1 to 65535`,
			`testdata/both.yaml:9: server.sim: only applies to engine: sim`,
			`testdata/both.yaml:11: server.restart.max: must be >= 0`,
		}},
		{"endpoints.yaml", []string{
			`testdata/endpoints.yaml:5: endpoints[1].url: http://a:8000 is also endpoints[0]`,
			`testdata/endpoints.yaml:6: endpoints[2].url: "http://b:8000/v1/chat/completions" is an API route: write the server root (http://b:8000); regen adds /v1/chat/completions itself`,
			`testdata/endpoints.yaml:7: endpoints[3].url: "http://user:secret@c:8000" carries credentials: put the key in an environment variable and name it in api_key_env`,
			`testdata/endpoints.yaml:8: endpoints[4].url: "http://d:8000/?x=1": want the server root without ?query or #fragment`,
			`testdata/endpoints.yaml:9: endpoints[5].url: "http://e:99999": port 99999 is not 1 to 65535`,
			`testdata/endpoints.yaml:10: balance: "sideways" is not one of affinity, tokens, affinity-only`,
		}},
		{"capture_invalid.yaml", []string{
			`testdata/capture_invalid.yaml:6: capture.endpoints[0].url: "http://127.0.0.1:8000/v1/completions" is an API route: write the server root (http://127.0.0.1:8000); regen adds /v1/chat/completions itself`,
			`testdata/capture_invalid.yaml:7: capture.endpoints[1].url: "ftp://x": want an http:// or https:// URL`,
			`testdata/capture_invalid.yaml:4: capture: needs output.token_ids: true (the capture sends each sample's exact token ids)`,
			`testdata/capture_invalid.yaml:8: capture.concurrency: must be >= 1`,
			`testdata/capture_invalid.yaml:9: capture.dir: must be a folder of its own, not the job's folder`,
			`testdata/capture_invalid.yaml:10: capture.layers: must be >= 0 (0 = as the first file says)`,
			`testdata/capture_invalid.yaml:11: capture.hidden: must be >= 0 (0 = as the first file says)`,
			`testdata/capture_invalid.yaml:12: capture.dtype: unknown dtype "fp8" (want bf16, f16, f32, or leave it out to take the first file's)`,
			`testdata/capture_invalid.yaml:13: capture.max_attempts: must be >= 1`,
			`testdata/capture_invalid.yaml:14: capture.request_timeout: must be > 0`,
			`testdata/capture_invalid.yaml:15: capture.down_after: must be >= 0 (0 waits for ever)`,
		}},
		{"neither.yaml", []string{
			`testdata/neither.yaml:1: endpoints: set endpoints (servers to call) or server (a server regen launches)`,
		}},
		// A bad key does not hide the settings' problems (this file has no
		// endpoints), nor is it reported twice in other words.
		{"unknown_field.yaml", []string{`testdata/unknown_field.yaml:8:5: lanes[0].concurency: unknown field "concurency" (did you mean "concurrency"?)`,
			`testdata/unknown_field.yaml:1: endpoints: set endpoints (servers to call) or server (a server regen launches)`}},
		{"wrong_type.yaml", []string{`testdata/wrong_type.yaml:8:18: lanes[0].concurrency: want integer or auto, got string "many"`,
			`testdata/wrong_type.yaml:1: endpoints: set endpoints (servers to call) or server (a server regen launches)`}},
		// Every problem in one pass; a quoted number is refused like a word.
		{"several.yaml", []string{
			`testdata/several.yaml:2:1: modle: unknown field "modle" (did you mean "model"?)`,
			`testdata/several.yaml:7:5: sources[0].promt: unknown field "promt" (did you mean "prompt"?)`,
			`testdata/several.yaml:10:18: lanes[0].concurrency: want integer or auto, got string "4" (write 4 without quotes)`,
			`testdata/several.yaml:11:5: lanes[0].max_token: unknown field "max_token" (did you mean "max_tokens"?)`,
			`testdata/several.yaml:13:18: lanes[1].concurrency: want integer or auto, got string "four"`,
			`testdata/several.yaml:15:15: retry.base_delay: invalid duration "3 seconds" (want e.g. 30s, 5m, 2h)`,
			`testdata/several.yaml:16:17: retry.max_attempts: want integer, got number 2.5`,
		}},
		{"bad_duration.yaml", []string{`testdata/bad_duration.yaml:5:15: retry.base_delay: invalid duration "3 seconds" (want e.g. 30s, 5m, 2h)`}},
		{"syntax.yaml", []string{`testdata/syntax.yaml:4:4: value is not allowed in this context`}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			s, err := Load(filepath.Join("testdata", tt.file))
			if s != nil {
				t.Errorf("Load returned a Spec with errors")
			}
			if diff := cmp.Diff(tt.want, errLines(err)); diff != "" {
				t.Errorf("Load(%s) errors mismatch (-want +got):\n%s", tt.file, diff)
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Errorf("Load(%s) error is not a *FieldError: %T", tt.file, err)
			}
		})
	}
}

func TestLoadCaptureDefaults(t *testing.T) {
	got, err := Load("testdata/capture.yaml")
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := &Capture{
		Endpoints:   []CaptureEndpoint{{URL: "http://127.0.0.1:8000"}, {URL: "http://127.0.0.1:8001", APIKeyEnv: "CAPTURE_KEY"}},
		Concurrency: DefaultCaptureConcurrency, Dir: filepath.Join(abs(t, "testdata"), DefaultCaptureDir), Model: "m1",
		Layers: 3, DType: "bf16", MaxAttempts: DefaultCaptureAttempts,
		RequestTimeout: DefaultCaptureRequestTimeout, DownAfter: DefaultCaptureDownAfter, FileWait: DefaultCaptureFileWait,
	}
	if d := cmp.Diff(want, got.Capture); d != "" {
		t.Errorf("capture (-want +got):\n%s", d)
	}
	if s, err := Load("testdata/neither.yaml"); err == nil && s.Capture != nil {
		t.Errorf("a job without capture: got %+v", s.Capture)
	}
}

func TestLoadMissingFile(t *testing.T) {
	if _, err := Load("testdata/does-not-exist.yaml"); err == nil || !strings.Contains(err.Error(), "does-not-exist.yaml") {
		t.Errorf("Load(missing) = %v; want an error naming the file", err)
	}
}

func TestExamplesLoad(t *testing.T) {
	for _, p := range []string{"../../examples/demo/job.yaml", "../../examples/job.example.yaml"} {
		if _, err := Load(p); err != nil {
			t.Errorf("Load(%s): %v", p, err)
		}
	}
	s, err := Load("../../examples/demo/job.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if s.Server == nil || s.Server.Engine != "sim" || s.Model != "sim-model" {
		t.Errorf("demo server = %+v, model %q; want engine sim, model sim-model", s.Server, s.Model)
	}
	if got := s.LaneFor("B2_opencode", 10); got != "long" {
		t.Errorf("demo LaneFor(B2_opencode) = %q, want long", got)
	}
	if got := s.LaneFor("B1_glaive", 10); got != "short" {
		t.Errorf("demo LaneFor(B1_glaive) = %q, want short", got)
	}
}

func TestValidateInCode(t *testing.T) {
	// A Spec built in code has no file: errors carry only field and message.
	s := &Spec{Name: "x", Sources: []Source{{Partition: "p", Path: "p", Prompt: "q"}}, Endpoints: []Endpoint{{URL: "http://h:1"}}}
	s.applyDefaults()
	if err := s.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	s.Lanes[0].MaxTokens = 0
	if got, want := errLines(s.Validate()), []string{"lanes[0].max_tokens: must be > 0"}; !cmp.Equal(got, want) {
		t.Errorf("Validate() = %q, want %q", got, want)
	}
}

func TestLaneFor(t *testing.T) {
	s := &Spec{
		Sources: []Source{{Partition: "forced", Lane: "huge"}, {Partition: "p"}, {Partition: "q"}},
		Lanes: []Lane{
			{Name: "small", MaxTokens: 1000, MaxPromptTokens: 500},
			{Name: "mid", MaxTokens: 4000},
			{Name: "huge", MaxTokens: 16000, Partitions: []string{"q"}},
			{Name: "tiny", MaxTokens: 100, MaxPromptTokens: 50},
		},
	}
	tests := []struct {
		partition string
		tokens    int
		want      string
	}{
		{"forced", 10, "huge"}, // source override wins over token rules
		{"q", 10, "huge"},      // partition rule wins over token rules
		{"p", 10, "small"},     // first lane whose max_prompt_tokens admits it
		{"p", 500, "small"},
		{"p", 501, "mid"}, // default lane: first without rules
		{"other", 100000, "mid"},
	}
	for _, tt := range tests {
		if got := s.LaneFor(tt.partition, tt.tokens); got != tt.want {
			t.Errorf("LaneFor(%q, %d) = %q, want %q", tt.partition, tt.tokens, got, tt.want)
		}
	}
	// Every lane has a rule: fall back to the first lane.
	ruled := &Spec{Lanes: []Lane{{Name: "a", MaxPromptTokens: 5}, {Name: "b", Partitions: []string{"x"}}}}
	if got := ruled.LaneFor("y", 10); got != "a" {
		t.Errorf("LaneFor with only ruled lanes = %q, want a", got)
	}
	if got := (&Spec{}).LaneFor("y", 1); got != "" {
		t.Errorf("LaneFor without lanes = %q, want empty", got)
	}
}

func TestEscalationLane(t *testing.T) {
	s := &Spec{Lanes: []Lane{{Name: "a", MaxTokens: 4000}, {Name: "b", MaxTokens: 16000}, {Name: "c", MaxTokens: 8000}, {Name: "d", MaxTokens: 8000}}}
	tests := []struct {
		lane   string
		want   string
		wantOK bool
	}{
		{"a", "c", true}, // smallest bigger; first of equals
		{"c", "b", true},
		{"d", "b", true},
		{"b", "", false},
		{"nope", "", false},
	}
	for _, tt := range tests {
		got, ok := s.EscalationLane(tt.lane)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("EscalationLane(%q) = %q, %v; want %q, %v", tt.lane, got, ok, tt.want, tt.wantOK)
		}
	}
	if l, ok := s.Lane("c"); !ok || l.MaxTokens != 8000 {
		t.Errorf("Lane(c) = %+v, %v", l, ok)
	}
}

func TestParams(t *testing.T) {
	s, err := Load("testdata/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Generation.Params()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for k, v := range p {
		got[k] = string(v)
	}
	want := map[string]string{
		"temperature":          "0.5",
		"top_p":                "0.9",
		"chat_template_kwargs": `{"enable_thinking":false}`,
		"top_k":                "20",
		"stop":                 `["\u003c/s\u003e"]`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Params() mismatch (-want +got):\n%s", diff)
	}
	for k, v := range p {
		if !json.Valid(v) {
			t.Errorf("Params()[%s] = %s is not JSON", k, v)
		}
	}
	empty, err := Generation{}.Params()
	if err != nil || len(empty) != 0 {
		t.Errorf("Generation{}.Params() = %v, %v; want empty", empty, err)
	}
}

func TestSanitizeName(t *testing.T) {
	for in, want := range map[string]string{"demo": "demo", "min/job": "min_job", "a b:c": "a_b_c", "..": "job", "": "job", "x.y-z_1": "x.y-z_1"} {
		if got := sanitizeName(in); got != want {
			t.Errorf("sanitizeName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSuggest(t *testing.T) {
	known := yamlFields(reflect.TypeOf(Lane{}))
	for key, want := range map[string]string{
		"concurency":  "concurrency",
		"max_token":   "max_tokens",
		"partition":   "partitions",
		"temperature": "", // not a lane key, and nothing close
		"x":           "",
	} {
		if got := suggest(key, known); got != want {
			t.Errorf("suggest(%q) = %q, want %q", key, got, want)
		}
	}
}
