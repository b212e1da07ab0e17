package sim

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nlpodyssey/safetensors"
)

// captureConfig is a fast vLLM server writing hidden states into a temp dir.
func captureConfig(t *testing.T) Config {
	c := testConfig()
	c.Engine = EngineVLLM
	c.HiddenStates = t.TempDir()
	c.HiddenSize = 8
	c.HiddenLayers = 3
	return c
}

// captureAnswer is the part of vLLM's completion answer a capture client reads.
type captureAnswer struct {
	ID      string `json:"id"`
	Choices []struct {
		PromptTokenIDs []int64 `json:"prompt_token_ids"`
		TokenIDs       []int64 `json:"token_ids"`
	} `json:"choices"`
	Usage            usage `json:"usage"`
	KVTransferParams *struct {
		HiddenStatesPath string `json:"hidden_states_path"`
	} `json:"kv_transfer_params"`
}

// askCapture sends the request speculators sends: the prompt's ids, one
// output token, token ids returned.
func askCapture(t *testing.T, url string, ids []int64) captureAnswer {
	t.Helper()
	prompt, _ := json.Marshal(ids)
	body := fmt.Sprintf(`{"model":"m","prompt":%s,"max_tokens":1,"return_token_ids":true}`, prompt)
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var a captureAnswer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		t.Fatalf("decode answer: %v", err)
	}
	if len(a.Choices) != 1 || a.KVTransferParams == nil || a.KVTransferParams.HiddenStatesPath == "" {
		t.Fatalf("answer %+v: want one choice and kv_transfer_params.hidden_states_path", a)
	}
	return a
}

// readCapture waits for the writer's lock as vLLM's load_hidden_states
// does (flock LOCK_SH on <path>.lock), then reads the file.
func readCapture(t *testing.T, path string) (safetensors.SafeTensors, []byte, error) {
	t.Helper()
	lock, err := os.Open(path + ".lock")
	if err != nil {
		t.Fatalf("lock file: %v", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_SH); err != nil {
		t.Fatalf("flock: %v", err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return safetensors.SafeTensors{}, nil, err
	}
	st, err := safetensors.Deserialize(b)
	return st, b, err
}

var testIDs = []int64{163584, 7, 42, 100, 101, 9, 163585, 3}

// decodeIDs reads an int64 tensor.
func decodeIDs(t *testing.T, st safetensors.SafeTensors) []int64 {
	t.Helper()
	tv, ok := st.Tensor("token_ids")
	if !ok || tv.DType() != safetensors.I64 {
		t.Fatalf("token_ids: present %v, dtype %v; want I64", ok, tv.DType())
	}
	out := make([]int64, len(tv.Data())/8)
	for i := range out {
		out[i] = int64(binary.LittleEndian.Uint64(tv.Data()[8*i:]))
	}
	return out
}

// decodeFloats reads a float tensor of any of the three dtypes.
func decodeFloats(t *testing.T, tv safetensors.TensorView) []float32 {
	t.Helper()
	size := int(tv.DType().Size())
	out := make([]float32, len(tv.Data())/size)
	for i := range out {
		b := tv.Data()[size*i:]
		switch tv.DType() {
		case safetensors.F32:
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b))
		case safetensors.BF16:
			out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(b)) << 16)
		case safetensors.F16:
			out[i] = half(binary.LittleEndian.Uint16(b))
		default:
			t.Fatalf("dtype %v", tv.DType())
		}
	}
	return out
}

// half decodes IEEE half precision (normal numbers, zero, NaN).
func half(h uint16) float32 {
	sign := float32(1)
	if h&0x8000 != 0 {
		sign = -1
	}
	exp, frac := int(h>>10&0x1f), float64(h&0x3ff)
	switch {
	case exp == 0x1f && frac != 0:
		return float32(math.NaN())
	case exp == 0x1f:
		return sign * float32(math.Inf(1))
	case exp == 0 && frac == 0:
		return 0 * sign
	}
	return sign * float32(math.Ldexp(1+frac/1024, exp-15))
}

// The wire and the file, in each dtype: the answer carries the prompt ids in
// choices[0] and the absolute path in the top-level kv_transfer_params; the
// file holds token_ids [seq] and hidden_states [seq, layers, hidden] whose
// values are HiddenValue's; the prompt went through the scheduler.
func TestHiddenStatesWire(t *testing.T) {
	for _, dtype := range []string{"bf16", "f16", "f32"} {
		t.Run(dtype, func(t *testing.T) {
			c := captureConfig(t)
			c.HiddenDType = dtype
			_, url, _ := startServer(t, c)
			before := scrape(t, url)["vllm:prompt_tokens_total"]
			a := askCapture(t, url, testIDs)
			if diff := cmp.Diff(testIDs, a.Choices[0].PromptTokenIDs); diff != "" {
				t.Errorf("prompt_token_ids (-sent +got):\n%s", diff)
			}
			if len(a.Choices[0].TokenIDs) != 1 || a.Usage.PromptTokens != len(testIDs) {
				t.Errorf("token_ids %v, prompt_tokens %d; want 1 id and %d", a.Choices[0].TokenIDs, a.Usage.PromptTokens, len(testIDs))
			}
			if got := scrape(t, url)["vllm:prompt_tokens_total"] - before; got != float64(len(testIDs)) {
				t.Errorf("prefilled %v prompt tokens, want %d", got, len(testIDs))
			}
			path := a.KVTransferParams.HiddenStatesPath
			if !filepath.IsAbs(path) || filepath.Dir(path) != c.HiddenStates || !strings.HasSuffix(path, ".safetensors") {
				t.Errorf("hidden_states_path %q: want an absolute .safetensors path in %s", path, c.HiddenStates)
			}
			st, _, err := readCapture(t, path)
			if err != nil {
				t.Fatalf("read %s: %v", path, err)
			}
			if diff := cmp.Diff(testIDs, decodeIDs(t, st)); diff != "" {
				t.Errorf("file token_ids (-sent +got):\n%s", diff)
			}
			hs, _ := st.Tensor("hidden_states")
			if diff := cmp.Diff([]uint64{uint64(len(testIDs)), 3, 8}, hs.Shape()); diff != "" || hs.DType() != hiddenDTypes[dtype] {
				t.Fatalf("hidden_states dtype %v shape %v, want %s [8 3 8]", hs.DType(), hs.Shape(), dtype)
			}
			vals := decodeFloats(t, hs)
			for i, v := range vals {
				tok, layer, j := i/24, i/8%3, i%8
				if want := HiddenValue(testIDs[tok], layer, j); v != want {
					t.Fatalf("element %d (token %d layer %d index %d) = %v, want %v", i, tok, layer, j, v, want)
				}
			}
		})
	}
}

// TestHiddenStatesFaults: each fault, read back as a capture client reads
// (lock, then file), shows exactly the damage it names; the others' files
// stay whole.
func TestHiddenStatesFaults(t *testing.T) {
	// oneBad checks that exactly one element, the middle token's first, is bad.
	oneBad := func(what string, bad func(float64) bool) func(*testing.T, captureAnswer, safetensors.SafeTensors, []byte, error) {
		return func(t *testing.T, _ captureAnswer, st safetensors.SafeTensors, _ []byte, err error) {
			if err != nil {
				t.Fatal(err)
			}
			hs, _ := st.Tensor("hidden_states")
			var at []int
			for i, v := range decodeFloats(t, hs) {
				if bad(float64(v)) {
					at = append(at, i)
				}
			}
			if diff := cmp.Diff([]int{len(testIDs) / 2 * 24}, at); diff != "" {
				t.Errorf("%s elements (-want +got):\n%s", what, diff)
			}
		}
	}
	tests := []struct {
		fault string
		check func(t *testing.T, a captureAnswer, st safetensors.SafeTensors, raw []byte, err error)
	}{
		{HiddenFaultNaN, oneBad("NaN", math.IsNaN)},
		{HiddenFaultInf, oneBad("+Inf", func(v float64) bool { return math.IsInf(v, 1) })},
		{HiddenFaultWrongIDs, func(t *testing.T, a captureAnswer, st safetensors.SafeTensors, _ []byte, err error) {
			if err != nil {
				t.Fatal(err)
			}
			if got := differing(testIDs, decodeIDs(t, st)); !cmp.Equal(got, []int{len(testIDs) / 2}) {
				t.Errorf("file ids differ from the prompt at %v, want one index %d", got, len(testIDs)/2)
			}
			if !cmp.Equal(testIDs, a.Choices[0].PromptTokenIDs) {
				t.Errorf("prompt_token_ids %v changed too", a.Choices[0].PromptTokenIDs)
			}
		}},
		{HiddenFaultMissing, func(t *testing.T, a captureAnswer, _ safetensors.SafeTensors, _ []byte, err error) {
			if !errors.Is(err, os.ErrNotExist) {
				t.Errorf("read: %v, want the file not to exist", err)
			}
		}},
		{HiddenFaultTruncated, func(t *testing.T, a captureAnswer, _ safetensors.SafeTensors, raw []byte, err error) {
			if err == nil || len(raw) == 0 {
				t.Fatalf("read %d bytes, error %v; want a cut file that does not parse", len(raw), err)
			}
			if _, _, herr := safetensors.ReadMetadata(raw); herr == nil {
				if _, derr := safetensors.Deserialize(raw); derr == nil {
					t.Errorf("truncated file of %d bytes deserializes", len(raw))
				}
			}
		}},
		{HiddenFaultWrongPromptIDs, func(t *testing.T, a captureAnswer, st safetensors.SafeTensors, _ []byte, err error) {
			if err != nil {
				t.Fatal(err)
			}
			if got := differing(testIDs, a.Choices[0].PromptTokenIDs); !cmp.Equal(got, []int{len(testIDs) / 2}) {
				t.Errorf("prompt_token_ids differ from the prompt at %v, want one index", got)
			}
			if !cmp.Equal(testIDs, decodeIDs(t, st)) {
				t.Errorf("file ids changed too")
			}
		}},
	}
	for _, tt := range tests {
		dtypes := []string{"bf16"}
		if tt.fault == HiddenFaultNaN || tt.fault == HiddenFaultInf {
			dtypes = []string{"bf16", "f16", "f32"} // each dtype's encoding of the bad value
		}
		for _, dt := range dtypes {
			t.Run(tt.fault+"/"+dt, func(t *testing.T) {
				c := captureConfig(t)
				c.HiddenStatesFault, c.HiddenDType = tt.fault, dt
				_, url, _ := startServer(t, c)
				a := askCapture(t, url, testIDs)
				st, raw, err := readCapture(t, a.KVTransferParams.HiddenStatesPath)
				tt.check(t, a, st, raw, err)
			})
		}
	}
}

func differing(a, b []int64) []int {
	var out []int
	for i := range max(len(a), len(b)) {
		if i >= len(a) || i >= len(b) || a[i] != b[i] {
			out = append(out, i)
		}
	}
	return out
}

// TestHiddenStatesSlowWriter: the answer comes while the writer still holds
// the lock and the file is half written; a reader that waits for the lock
// reads the whole file.
func TestHiddenStatesSlowWriter(t *testing.T) {
	c := captureConfig(t)
	c.HiddenStatesFault = HiddenFaultSlow
	c.HiddenStatesSlow = 2000 * time.Second // 2 s real at speed 1000
	_, url, _ := startServer(t, c)
	a := askCapture(t, url, testIDs)
	path := a.KVTransferParams.HiddenStatesPath
	lock, err := os.Open(path + ".lock")
	if err != nil {
		t.Fatalf("lock file at answer time: %v", err)
	}
	err = syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	lock.Close()
	if !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Fatalf("flock at answer time: %v, want the writer to hold it", err)
	}
	if raw, err := os.ReadFile(path); err == nil {
		if _, err := safetensors.Deserialize(raw); err == nil {
			t.Errorf("the file is whole at answer time (%d bytes); want it half written", len(raw))
		}
	}
	st, _, err := readCapture(t, path)
	if err != nil {
		t.Fatalf("after the lock: %v", err)
	}
	if !cmp.Equal(testIDs, decodeIDs(t, st)) {
		t.Errorf("file ids differ after the slow write")
	}
}

// TestHiddenStatesFaultEvery: with every 2, the 2nd and 4th requests get
// the fault and the 1st and 3rd do not.
func TestHiddenStatesFaultEvery(t *testing.T) {
	c := captureConfig(t)
	c.HiddenStatesFault = HiddenFaultMissing
	c.HiddenStatesFaultEvery = 2
	_, url, _ := startServer(t, c)
	var got []bool
	for range 4 {
		_, _, err := readCapture(t, askCapture(t, url, testIDs).KVTransferParams.HiddenStatesPath)
		got = append(got, err == nil)
	}
	if diff := cmp.Diff([]bool{true, false, true, false}, got); diff != "" {
		t.Errorf("files present per request (-want +got):\n%s", diff)
	}
}

func TestHiddenStatesConfig(t *testing.T) {
	c := DefaultConfig()
	err := c.Apply(map[string]any{"engine": "vllm", "hidden_states": "/tmp/hs", "hidden_size": 16, "layers": 4,
		"hidden_dtype": "f16", "hidden_states_fault": "slow", "hidden_states_fault_every": 3, "hidden_states_slow": "5s"})
	if err != nil {
		t.Fatal(err)
	}
	got := []any{c.HiddenStates, c.HiddenSize, c.HiddenLayers, c.HiddenDType, c.HiddenStatesFault, c.HiddenStatesFaultEvery, c.HiddenStatesSlow}
	want := []any{"/tmp/hs", 16, 4, "f16", "slow", 3, 5 * time.Second}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Apply (-want +got):\n%s", diff)
	}
	for _, bad := range []func(*Config){
		func(c *Config) { c.Engine = EngineSGLang },
		func(c *Config) { c.HiddenDType = "f64" },
		func(c *Config) { c.HiddenStatesFault = "fire" },
		func(c *Config) { c.HiddenLayers = 0 },
		func(c *Config) { c.HiddenStatesFaultEvery = 0 },
	} {
		b := c
		bad(&b)
		if err := b.validate(); err == nil {
			t.Errorf("validate(%+v) = nil, want an error", b)
		}
	}
}

// BenchmarkHiddenStatesCapture measures what a capture request costs the
// simulator beyond its simulated prefill: 1,024 prompt ids, 3 layers of
// 256 in bf16 (1.5 MiB a file), written under the lock before the answer.
func BenchmarkHiddenStatesCapture(b *testing.B) {
	c := testConfig()
	c.Engine, c.Speed = EngineVLLM, 1e6
	c.HiddenStates, c.HiddenSize, c.HiddenLayers = b.TempDir(), 256, 3
	_, url, _ := startServer(b, c)
	ids := make([]int64, 1024)
	for i := range ids {
		ids[i] = int64(100 + i%5000)
	}
	prompt, _ := json.Marshal(ids)
	body := fmt.Sprintf(`{"model":"m","prompt":%s,"max_tokens":1,"return_token_ids":true}`, prompt)
	var bytes int64
	b.ResetTimer()
	for range b.N {
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		var a captureAnswer
		err = json.NewDecoder(resp.Body).Decode(&a)
		resp.Body.Close()
		if err != nil || a.KVTransferParams == nil {
			b.Fatalf("answer: %v", err)
		}
		st, err := os.Stat(a.KVTransferParams.HiddenStatesPath)
		if err != nil {
			b.Fatal(err)
		}
		bytes += st.Size()
		os.Remove(a.KVTransferParams.HiddenStatesPath)
		os.Remove(a.KVTransferParams.HiddenStatesPath + ".lock")
	}
	b.ReportMetric(float64(bytes)/float64(b.N), "file-bytes/op")
	b.SetBytes(bytes / int64(b.N))
}

// TestHiddenStatesWriterDiesWithServer: a server that ends during a slow
// write leaves the half file and releases the lock, as a killed vLLM does
// (the kernel drops a dead process's flock); a reader that waited for the
// lock then finds a file that does not parse.
func TestHiddenStatesWriterDiesWithServer(t *testing.T) {
	c := captureConfig(t)
	c.HiddenStatesFault = HiddenFaultSlow
	c.HiddenStatesSlow = 1e6 * time.Second // far beyond the test
	s, url, _ := startServer(t, c)
	path := askCapture(t, url, testIDs).KVTransferParams.HiddenStatesPath
	s.Close() // waits for the writer
	lock, err := os.Open(path + ".lock")
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatalf("lock after the server ended: %v, want it free", err)
	}
	raw, err := os.ReadFile(path)
	if err != nil || len(raw) == 0 {
		t.Fatalf("half file: %d bytes, %v", len(raw), err)
	}
	if _, err := safetensors.Deserialize(raw); err == nil {
		t.Errorf("the half file (%d bytes) parses", len(raw))
	}
}

// TestCompletionTokenIDs: as vLLM, a completion that asks for token ids
// gets its prompt's and output's ids in its choice (a text prompt's ids
// from the simulator's tokenizer, counted as its prompt tokens), and no
// kv_transfer_params without --hidden-states.
func TestCompletionTokenIDs(t *testing.T) {
	c := testConfig()
	c.Engine = EngineVLLM
	_, url, _ := startServer(t, c)
	var out struct {
		Choices []struct {
			PromptTokenIDs []int64 `json:"prompt_token_ids"`
			TokenIDs       []int64 `json:"token_ids"`
		} `json:"choices"`
		Usage            usage           `json:"usage"`
		KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	}
	body := `{"model":"m","prompt":"queues and caches and more","max_tokens":5,"return_token_ids":true}`
	if err := json.Unmarshal(postJSON(t, url+"/v1/completions", body), &out); err != nil {
		t.Fatal(err)
	}
	ch := out.Choices[0]
	if len(ch.PromptTokenIDs) == 0 || len(ch.PromptTokenIDs) != out.Usage.PromptTokens || len(ch.TokenIDs) != out.Usage.CompletionTokens || out.KVTransferParams != nil {
		t.Errorf("prompt ids %v (prompt_tokens %d), %d output ids (completion_tokens %d), kv_transfer_params %s",
			ch.PromptTokenIDs, out.Usage.PromptTokens, len(ch.TokenIDs), out.Usage.CompletionTokens, out.KVTransferParams)
	}
}
