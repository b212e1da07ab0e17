package engine

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/job"
)

func TestLaunchArgs(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		engine string
		server job.Server
		model  string
		want   []string
	}{
		{
			engine: "sglang",
			server: job.Server{Port: 30000, Args: []string{"--tp-size", "8", "--mem-fraction-static", "0.93"}},
			model:  "/models/Kimi-K2.5",
			want: []string{"python3", "-m", "sglang.launch_server", "--model-path", "/models/Kimi-K2.5",
				"--host", "127.0.0.1", "--port", "30000", "--enable-metrics", "--tp-size", "8", "--mem-fraction-static", "0.93"},
		},
		{
			engine: "sglang",
			server: job.Server{Command: []string{"/opt/venv/bin/python", "-m", "sglang.launch_server"}, Host: "0.0.0.0", Port: 30001},
			model:  "m",
			want:   []string{"/opt/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "m", "--host", "0.0.0.0", "--port", "30001", "--enable-metrics"},
		},
		{
			engine: "vllm",
			server: job.Server{Port: 8000, Args: []string{"--tensor-parallel-size", "2"}},
			model:  "Qwen/Qwen3-8B",
			want:   []string{"vllm", "serve", "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", "8000", "--tensor-parallel-size", "2"},
		},
		{
			engine: "llamacpp",
			server: job.Server{Port: 8080, Args: []string{"-c", "32768", "-np", "8"}},
			model:  "/m/q.gguf",
			want:   []string{"llama-server", "-m", "/m/q.gguf", "--host", "127.0.0.1", "--port", "8080", "--metrics", "-c", "32768", "-np", "8"},
		},
		{
			engine: "llamacpp",
			server: job.Server{Port: 8080, Args: []string{"-hf", "org/repo"}},
			model:  "",
			want:   []string{"llama-server", "--host", "127.0.0.1", "--port", "8080", "--metrics", "-hf", "org/repo"},
		},
		{
			engine: "sim",
			server: job.Server{Port: 0, Sim: map[string]any{"speed": 10, "kv_tokens": 231120}},
			model:  "sim-model",
			want:   []string{self, "sim", "--model-path", "sim-model", "--host", "127.0.0.1", "--port", "0", "--kv-tokens=231120", "--speed=10"},
		},
	}
	for _, tt := range tests {
		d, err := Lookup(tt.engine)
		if err != nil {
			t.Fatal(err)
		}
		got := d.LaunchArgs(tt.server, tt.model)
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s LaunchArgs mismatch (-want +got):\n%s", tt.engine, diff)
		}
	}
}

func TestLookup(t *testing.T) {
	tests := []struct {
		name      string
		wantName  string
		readyPath string
		readyLine string
		wantErr   bool
	}{
		{"", SGLang, "/health_generate", ReadyLineSGLang, false},
		{"sglang", SGLang, "/health_generate", ReadyLineSGLang, false},
		{"SIM", Sim, "/health_generate", ReadyLineSGLang, false},
		{"vllm", VLLM, "/health", "", false},
		{"llamacpp", LlamaCpp, "/health", "", false},
		{"tgi", "", "", "", true},
	}
	for _, tt := range tests {
		d, err := Lookup(tt.name)
		if (err != nil) != tt.wantErr {
			t.Fatalf("Lookup(%q) err = %v, want error %v", tt.name, err, tt.wantErr)
		}
		if err != nil {
			continue
		}
		if d.Name != tt.wantName || d.ReadyPath != tt.readyPath || d.ReadyLine != tt.readyLine {
			t.Errorf("Lookup(%q) = {%s %s %q}, want {%s %s %q}", tt.name, d.Name, d.ReadyPath, d.ReadyLine, tt.wantName, tt.readyPath, tt.readyLine)
		}
		if d.ProbeTimeout <= 20e9 {
			t.Errorf("Lookup(%q).ProbeTimeout = %v, want > 20s (SGLang health waits 20s)", tt.name, d.ProbeTimeout)
		}
	}
}

func TestLookupReturnsCopies(t *testing.T) {
	d, _ := Lookup("sglang")
	d.Command[0] = "changed"
	d2, _ := Lookup("sglang")
	if d2.Command[0] != "python3" {
		t.Errorf("Lookup shares its Command slice: got %q after a caller changed it", d2.Command[0])
	}
}

// TestMetricsEvidence: only the series a scrape contained are shown; a
// llama-server without KV usage or retraction counters does not claim
// token_usage=0.00 retractions_total=0.
func TestMetricsEvidence(t *testing.T) {
	tests := []struct {
		m    Metrics
		want string
	}{
		{Metrics{Running: 8, Queued: 0, GenerationTokensTotal: 3400, Slots: 8, Context: 2048, MaxTotalTokens: 16384,
			Present: FieldRunning | FieldQueued | FieldGenerationTokensTotal | FieldSlots | FieldContext | FieldMaxTotalTokens},
			"running=8 queued=0 generation_tokens_total=3400 kv_pool=16384 slots=8 context=2048"},
		{Metrics{Running: 67, Queued: 9, TokenUsage: 0.934, RetractionsTotal: 0, Present: FieldRunning | FieldQueued | FieldTokenUsage | FieldRetractionsTotal},
			"running=67 queued=9 token_usage=0.93 retractions_total=0"},
		{Metrics{}, "no known series"},
	}
	for _, tt := range tests {
		if got := tt.m.Evidence(); got != tt.want {
			t.Errorf("Evidence() = %q, want %q", got, tt.want)
		}
	}
}

// TestSimAs: the simulator in llama.cpp mode is probed as llama-server
// (ready on /health, /props, llamacpp: metrics) and launched as the
// simulator, with its mode among its flags.
func TestSimAs(t *testing.T) {
	d, err := SimAs("llamacpp")
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != Sim || d.ReadyPath != "/health" || d.PropsPath != "/props" || !d.SlotBound || d.Metrics.Running[0] != "llamacpp:requests_processing" {
		t.Errorf("SimAs(llamacpp) = %+v; want llama-server's probes under the simulator's name", d)
	}
	argv := d.LaunchArgs(job.Server{Port: 1234, Sim: map[string]any{"engine": "llamacpp"}}, "m")
	if got := strings.Join(argv[1:], " "); got != "sim --model-path m --host 127.0.0.1 --port 1234 --engine=llamacpp" {
		t.Errorf("argv %q", got)
	}
	if d, _ := SimAs(""); d.ReadyPath != "/health_generate" || d.Name != Sim {
		t.Errorf("SimAs(\"\") = %+v, want the simulator's own (SGLang's) dialect", d)
	}
}

// TestTokenIDWarnings: a job exporting token ids is warned of each engine
// it names that cannot return them (llama-server, the simulator in its
// llama.cpp mode), at the field naming it; sglang, vllm and an endpoint
// left for detection are not, nor is a job that exports no ids.
func TestTokenIDWarnings(t *testing.T) {
	eps := []job.Endpoint{{URL: "http://a", Engine: "llamacpp"}, {URL: "http://b", Engine: "vllm"}, {URL: "http://c"}, {URL: "http://d", Engine: "sglang"}}
	for _, tc := range []struct {
		name string
		spec job.Spec
		want []string
	}{
		{"endpoints", job.Spec{Endpoints: eps, Output: job.Output{TokenIDs: true}}, []string{"endpoints[0].engine: llamacpp"}},
		{"no token ids asked", job.Spec{Endpoints: eps}, nil},
		{"sim in llama.cpp mode", job.Spec{Server: &job.Server{Engine: "sim", Sim: map[string]any{"engine": "llamacpp"}}, Output: job.Output{TokenIDs: true}},
			[]string{"server.engine: llamacpp"}},
		{"sim in its sglang mode", job.Spec{Server: &job.Server{Engine: "sim"}, Output: job.Output{TokenIDs: true}}, nil},
		{"launched llama-server", job.Spec{Server: &job.Server{Engine: "llamacpp"}, Output: job.Output{TokenIDs: true}}, []string{"server.engine: llamacpp"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, w := range TokenIDWarnings(&tc.spec) {
				if !strings.HasPrefix(w.Msg, "warning: ") {
					t.Errorf("%s: %q is not worded as a warning", w.Field, w.Msg)
				}
				got = append(got, w.Field+": "+strings.Fields(strings.TrimPrefix(w.Msg, "warning: "))[0])
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("warnings %q, want %q", got, tc.want)
			}
		})
	}
}
