package probe

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/sim"
)

// TestSimShapes reads the simulator in each engine mode and API shape as
// the dispatcher does: the capacity a real server of that kind reports.
func TestSimShapes(t *testing.T) {
	tests := []struct {
		name           string
		engine, shape  string
		dp, slots, ctx int
		kv             int
		dialect        string
		want           capacityView
		wantDetect     string
	}{
		{"sglang current, 2 DP ranks: /v1/loads", "sglang", "current", 2, 0, 262144, 231120, "sglang",
			capacityView{Pool: 231120, Ranks: 2}, "sglang"},
		{"sglang previous: /get_server_info only", "sglang", "previous", 1, 0, 262144, 231120, "sglang",
			capacityView{Pool: 231120, Ranks: 1}, "sglang"},
		{"vllm current: max_model_len", "vllm", "current", 1, 0, 32768, 100000, "vllm",
			capacityView{Pool: 100000, Context: 32768}, "vllm"},
		{"vllm previous: gpu_cache_usage_perc, no max_model_len", "vllm", "previous", 1, 0, 32768, 100000, "vllm",
			capacityView{Pool: 100000}, "vllm"},
		{"llama.cpp: 8 slots of 2048", "llamacpp", "current", 1, 8, 16384, 0, "llamacpp",
			capacityView{Pool: 16384, Slots: 8, Context: 2048}, "llamacpp"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := sim.DefaultConfig()
			c.Engine, c.APIShape, c.DP, c.ContextLen = tt.engine, tt.shape, tt.dp, tt.ctx
			if tt.slots > 0 {
				c.Slots = tt.slots
			}
			if tt.kv > 0 {
				c.KVTokens = tt.kv
			}
			srv := serveSim(t, c)
			m, err := Metrics(context.Background(), srv.Client(), srv.URL, dialect(t, tt.dialect))
			if err != nil {
				t.Fatal(err)
			}
			got := view(m)
			got.Running, got.Queued, got.Usage = 0, 0, 0 // an idle server: load is not the point here
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("capacity mismatch (-want +got):\n%s", diff)
			}
			name, evidence, err := Detect(context.Background(), srv.Client(), srv.URL)
			if err != nil || name != tt.wantDetect {
				t.Errorf("Detect = %q (%s), %v; want %q", name, evidence, err, tt.wantDetect)
			}
		})
	}
}

// TestSimSlotContext: the llama.cpp mode refuses a prompt that does not
// fit a slot, before generating, in llama-server's error shape.
func TestSimSlotContext(t *testing.T) {
	c := sim.DefaultConfig()
	c.Engine, c.Slots, c.ContextLen = "llamacpp", 8, 2048
	srv := serveSim(t, c)
	long := bytes.Repeat([]byte("word "), 2000) // ~2500 tokens at 4 bytes each
	body := `{"model":"m","messages":[{"role":"user","content":"` + string(long) + `"}],"max_tokens":16}`
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	if resp.StatusCode != 400 || !bytes.Contains(buf.Bytes(), []byte(`"type":"exceed_context_size_error"`)) ||
		!bytes.Contains(buf.Bytes(), []byte("exceeds the available context size (256 tokens)")) {
		t.Errorf("got %d %s; want 400 exceed_context_size_error naming the 256-token slot", resp.StatusCode, buf.String())
	}
}

// serveSim serves a simulator with c behind httptest until the test ends.
func serveSim(t *testing.T, c sim.Config) *httptest.Server {
	t.Helper()
	s, err := sim.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return srv
}

// Identify reads an SGLang server's priority scheduling from its server
// arguments: off, higher values first (the default), lower first with
// schedule_low_priority_values_first.
func TestIdentifyPriority(t *testing.T) {
	for _, tt := range []struct {
		name         string
		on, lowFirst bool
		wantPriority int
	}{
		{"off", false, false, 0},
		{"higher first", true, false, 1},
		{"lower first", true, true, -1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := sim.DefaultConfig()
			c.PriorityScheduling, c.LowPriorityFirst = tt.on, tt.lowFirst
			srv := serveSim(t, c)
			id, err := Identify(context.Background(), srv.Client(), srv.URL, dialect(t, "sglang"))
			if err != nil {
				t.Fatal(err)
			}
			if id.Priority != tt.wantPriority || id.Version == "" {
				t.Errorf("identity %+v, want priority %d and a version", id, tt.wantPriority)
			}
		})
	}
}
