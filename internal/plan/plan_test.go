package plan

import (
	"encoding/json"
	"errors"
	"flag"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite golden files")

func load(t *testing.T, name string) ModelConfig {
	t.Helper()
	m, err := LoadModelConfig(filepath.Join("testdata", name+".json"))
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	return m
}

func gpu(t *testing.T, name string) GPU {
	t.Helper()
	g, ok := LookupGPU(name)
	if !ok {
		t.Fatalf("gpu %s not in table", name)
	}
	return g
}

func TestLoadModelConfig(t *testing.T) {
	tests := []struct {
		file string
		want func(ModelConfig) []string // mismatches
	}{
		{"llama3-8b", func(m ModelConfig) []string {
			return diffInts(map[string][2]int{
				"layers": {m.NumLayers, 32}, "kv heads": {m.NumKVHeads, 8}, "head_dim": {m.HeadDim, 128}, "hidden": {m.HiddenSize, 4096},
			})
		}},
		{"llama3-70b", func(m ModelConfig) []string {
			return diffInts(map[string][2]int{"layers": {m.NumLayers, 80}, "kv heads": {m.NumKVHeads, 8}, "head_dim": {m.HeadDim, 128}})
		}},
		{"deepseek-v3", func(m ModelConfig) []string {
			d := diffInts(map[string][2]int{"layers": {m.NumLayers, 61}, "kv_lora_rank": {m.KVLoraRank, 512}, "rope": {m.QKRopeHeadDim, 64},
				"experts": {m.NumExperts, 256}, "first dense": {m.FirstKDenseReplace, 3}, "mtp": {m.NumNextNPredictLayers, 1}})
			if m.Quant == nil || m.Quant.Method != "fp8" || m.Quant.BlockSize != [2]int{128, 128} {
				d = append(d, "quant: want fp8 block 128x128")
			}
			return d
		}},
		{"kimi-k2.5", func(m ModelConfig) []string {
			d := diffInts(map[string][2]int{"layers (from text_config)": {m.NumLayers, 61}, "kv_lora_rank": {m.KVLoraRank, 512}, "rope": {m.QKRopeHeadDim, 64},
				"experts": {m.NumExperts, 384}, "moe inter": {m.MoEIntermediateSize, 2048}, "vocab": {m.VocabSize, 163840}})
			if q := m.Quant; q == nil || q.Method != "compressed-tensors" || q.Bits != 4 || q.GroupSize != 32 || q.Type != "int" || !q.Symmetric || len(q.Ignore) != 4 || q.KVCacheFP8 || q.KVCacheScheme {
				d = append(d, "quant: want compressed-tensors int4 group 32 symmetric, 4 ignores, no kv scheme")
			}
			if v := m.Vision; v == nil || v.NumLayers != 27 || v.HiddenSize != 1152 {
				d = append(d, "vision: want 27 layers of 1152 (vt_ keys)")
			}
			if m.Architecture != "KimiK25ForConditionalGeneration" || m.Dtype != "bfloat16" {
				d = append(d, "architecture/dtype")
			}
			return d
		}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			for _, d := range tt.want(load(t, tt.file)) {
				t.Error(d)
			}
		})
	}
}

func diffInts(m map[string][2]int) []string {
	var out []string
	for k, v := range m {
		if v[0] != v[1] {
			out = append(out, k+": got "+itoa(v[0])+", want "+itoa(v[1]))
		}
	}
	return out
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

func TestParseModelConfigVariants(t *testing.T) {
	// quantization_config at the top level instead of inside text_config,
	// and a modelopt-style FP8 KV declaration.
	b := []byte(`{"text_config": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 10},
		"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}, "torch_dtype": "bfloat16"}`)
	m, err := ParseModelConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	if m.Quant == nil || !m.Quant.KVCacheFP8 {
		t.Fatalf("quant = %+v, want kv_cache_quant_algo FP8 seen", m.Quant)
	}
	name, eb, _, err := KVElemBytes("auto", m, SGLang)
	if err != nil || name != "fp8_e4m3" || eb != 1 {
		t.Errorf("auto kv dtype = %s %d %v, want fp8_e4m3 1 (docs/engines.md §1.4)", name, eb, err)
	}
	if m.HeadDim != 16 {
		t.Errorf("head_dim = %d, want hidden/heads = 16", m.HeadDim)
	}
	if _, err := ParseModelConfig([]byte(`{"hidden_size": 8}`)); err == nil || !strings.Contains(err.Error(), "num_hidden_layers") {
		t.Errorf("missing layers: err = %v, want it named", err)
	}
}

func TestKVCellBytes(t *testing.T) {
	tests := []struct {
		model string
		tp    int
		kv    string
		want  int64
	}{
		// Hand: n_kv * (head_dim + v_head_dim) * layers * bytes.
		{"llama3-8b", 1, "auto", 8 * 256 * 32 * 2},  // 131072
		{"llama3-8b", 2, "bf16", 4 * 256 * 32 * 2},  // 65536: KV heads split over TP
		{"llama3-8b", 8, "bf16", 1 * 256 * 32 * 2},  // 16384
		{"llama3-8b", 16, "bf16", 1 * 256 * 32 * 2}, // tp > kv heads: one head replicated
		{"llama3-8b", 1, "fp8_e4m3", 8 * 256 * 32},  // 65536
		{"llama3-70b", 1, "auto", 8 * 256 * 80 * 2}, // 327680
		{"llama3-70b", 2, "auto", 4 * 256 * 80 * 2}, // 163840
		{"llama3-70b", 8, "auto", 1 * 256 * 80 * 2}, // 40960
		{"llama3-70b", 8, "fp8_e5m2", 1 * 256 * 80}, // 20480
		{"deepseek-v3", 1, "auto", 576 * 61 * 2},    // 70272: MLA latent
		{"deepseek-v3", 2, "auto", 576 * 61 * 2},    // MLA does not split over TP
		{"deepseek-v3", 8, "auto", 576 * 61 * 2},    //
		{"deepseek-v3", 8, "fp8_e4m3", 576 * 61},    // 35136
		{"kimi-k2.5", 8, "auto", 70272},             // docs/engines.md §2: 70,272 B/token
		{"kimi-k2.5", 8, "fp8", 35136},              //
	}
	for _, tt := range tests {
		m := load(t, tt.model)
		_, eb, _, err := KVElemBytes(tt.kv, m, SGLang)
		if err != nil {
			t.Fatal(err)
		}
		if got := KVCellBytes(m, tt.tp, eb); got != tt.want {
			t.Errorf("%s tp %d %s: cell = %d, want %d", tt.model, tt.tp, tt.kv, got, tt.want)
		}
	}
}

func TestEstimateWeights(t *testing.T) {
	tests := []struct {
		model      string
		tp         int
		wantParams float64 // published total parameters
		wantBytes  float64 // published checkpoint bytes (0 = skip)
		wantRank   float64 // per-rank GiB (0 = skip)
		tol        float64
	}{
		// Exact published counts: 8,030,261,248 and 70,553,706,496.
		{"llama3-8b", 1, 8030261248, 8030261248 * 2, 0, 1e-9},
		{"llama3-70b", 8, 70553706496, 0, 0, 1e-9},
		// DeepSeek-V3: 671B main + 14B MTP = 685B (model card).
		{"deepseek-v3", 8, 685e9, 0, 0, 0.01},
		// Kimi-K2.5: 554.30 GiB of safetensors, ~71.8 GiB per rank at TP8 (docs/engines.md §8).
		{"kimi-k2.5", 8, 0, 554.30 * float64(GiB), 71.8, 0.005},
	}
	for _, tt := range tests {
		e := EstimateWeights(load(t, tt.model), tt.tp)
		rel := func(got, want float64) float64 { return math.Abs(got-want) / want }
		if tt.wantParams > 0 && rel(float64(e.Params), tt.wantParams) > tt.tol {
			t.Errorf("%s params = %d, want %.0f (tol %g)", tt.model, e.Params, tt.wantParams, tt.tol)
		}
		if tt.wantBytes > 0 && rel(float64(e.CheckpointBytes), tt.wantBytes) > tt.tol {
			t.Errorf("%s checkpoint = %.2f GiB, want %.2f GiB", tt.model, gib(e.CheckpointBytes), tt.wantBytes/float64(GiB))
		}
		if tt.wantRank > 0 && rel(gib(e.PerRankBytes), tt.wantRank) > tt.tol {
			t.Errorf("%s per rank = %.2f GiB, want %.2f GiB", tt.model, gib(e.PerRankBytes), tt.wantRank)
		}
	}

	// Which Kimi parts are INT4: only routed experts (docs/engines.md §8).
	e := EstimateWeights(load(t, "kimi-k2.5"), 8)
	for _, p := range e.Parts {
		int4 := strings.HasPrefix(p.Format, "int4")
		if int4 != (p.Name == "routed experts") {
			t.Errorf("kimi part %q format %q: only routed experts should be int4", p.Name, p.Format)
		}
		if p.Name == "routed experts" && math.Abs(p.BytesPerParam-(0.5+2.0/32)) > 1e-12 {
			t.Errorf("routed experts bytes/param = %v, want 0.5 + 2/32 (bf16 scale per 32)", p.BytesPerParam)
		}
	}
	// DeepSeek-V3's MTP layer is in the checkpoint but not loaded.
	d := EstimateWeights(load(t, "deepseek-v3"), 8)
	if d.LoadedBytes >= d.CheckpointBytes {
		t.Errorf("deepseek loaded %d >= checkpoint %d: MTP should be excluded from loaded", d.LoadedBytes, d.CheckpointBytes)
	}
	// GQA: at TP 16 > 8 KV heads the k/v projections are partly replicated.
	l16 := EstimateWeights(load(t, "llama3-8b"), 16)
	l8 := EstimateWeights(load(t, "llama3-8b"), 8)
	if kv(l16) != kv(l8) {
		t.Errorf("k/v per rank at tp16 = %d, want the same as tp8 (%d): one head per rank", kv(l16), kv(l8))
	}
}

func kv(e WeightEstimate) int64 {
	for _, p := range e.Parts {
		if strings.HasPrefix(p.Name, "attention (k, v") {
			return p.PerRankBytes
		}
	}
	return -1
}

func TestComputeCapacity(t *testing.T) {
	tests := []struct {
		name string
		in   Input
		want int64
	}{
		// Hand: P 78 GiB, W = 8,030,261,248 x 2 B, f 0.9:
		// floor((78 GiB - W - 7.8 GiB) / 131072) = 452546.
		{"llama3-8b sglang tp1", Input{Model: load(t, "llama3-8b"), GPU: gpu(t, "h100"), MemFraction: 0.9, FreeBeforeWeights: 78 * GiB}, 452546},
		// Hand: 81559 MiB x 0.9 - W - 5 GiB activation, blocks of 16 x 131072 B: 423728.
		{"llama3-8b vllm tp1", Input{Model: load(t, "llama3-8b"), GPU: gpu(t, "h100"), Engine: VLLM}, 423728},
		// Page size floors the count.
		{"llama3-8b sglang page 64", Input{Model: load(t, "llama3-8b"), GPU: gpu(t, "h100"), MemFraction: 0.9, FreeBeforeWeights: 78 * GiB, PageSize: 64}, 452546 / 64 * 64},
		{"llama3-8b sglang max-total-tokens", Input{Model: load(t, "llama3-8b"), GPU: gpu(t, "h100"), MemFraction: 0.9, FreeBeforeWeights: 78 * GiB, MaxTotalTokens: 100000}, 100000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Compute(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Memory.MaxTotalTokens; got != tt.want {
				t.Errorf("tokens = %d, want %d\n%s", got, tt.want, strings.Join(p.Memory.Formula, "\n"))
			}
		})
	}
}

// TestTPScaling: GQA capacity grows with TP (heads split, weights split),
// MLA capacity grows only through the weights (the latent is replicated).
func TestTPScaling(t *testing.T) {
	for _, model := range []string{"llama3-70b", "deepseek-v3"} {
		var prev int64
		for _, tp := range []int{1, 2, 8} {
			in := Input{Model: load(t, model), GPU: gpu(t, "h200"), TP: tp, MemFraction: 0.88}
			p, err := Compute(in)
			var re *RefusalError
			if err != nil && !errors.As(err, &re) {
				t.Fatal(err)
			}
			P, W, f := float64(p.Memory.FreeBeforeWeightsBytes), float64(p.Weights.PerRankBytes), 0.88
			want := int64(0)
			if rest := P - W - P*(1-f); rest > 0 {
				want = int64(rest) / p.KV.CellBytes
			}
			if p.Memory.MaxTotalTokens != want {
				t.Errorf("%s tp %d: tokens %d, want %d by the formula", model, tp, p.Memory.MaxTotalTokens, want)
			}
			if want > 0 && prev > 0 && want <= prev {
				t.Errorf("%s tp %d: tokens %d not above tp/2's %d", model, tp, want, prev)
			}
			if model == "deepseek-v3" && tp < 8 && (re == nil || !re.Has(RefuseWeights)) {
				t.Errorf("deepseek-v3 tp %d: %.0f GiB per rank on 140 GiB should be refused (weights)", tp, gib(p.Weights.PerRankBytes))
			}
			prev = want
		}
	}
}

func TestFP8DoublesCapacity(t *testing.T) {
	for _, model := range []string{"llama3-8b", "kimi-k2.5"} {
		tp := 1
		g := gpu(t, "h200")
		if model == "kimi-k2.5" {
			tp, g = 8, gpu(t, "rtx-pro-6000")
		}
		bf, err := Compute(Input{Model: load(t, model), GPU: g, TP: tp, MemFraction: 0.92, KVDtype: "bf16"})
		if err != nil {
			t.Fatal(err)
		}
		f8, err := Compute(Input{Model: load(t, model), GPU: g, TP: tp, MemFraction: 0.92, KVDtype: "fp8_e4m3"})
		if err != nil {
			t.Fatal(err)
		}
		if f8.KV.CellBytes*2 != bf.KV.CellBytes {
			t.Errorf("%s: fp8 cell %d, bf16 cell %d: want half", model, f8.KV.CellBytes, bf.KV.CellBytes)
		}
		if d := f8.Memory.MaxTotalTokens - 2*bf.Memory.MaxTotalTokens; d < 0 || d > 1 {
			t.Errorf("%s: fp8 tokens %d, bf16 %d: want twice (floor)", model, f8.Memory.MaxTotalTokens, bf.Memory.MaxTotalTokens)
		}
	}
}

// kimiInput is Kimi-K2.5 on 8 x RTX PRO 6000 with the checkpoint size of
// docs/engines.md §8 and the --mem-fraction-static of DESIGN.md's example.
func kimiInput(t *testing.T) Input {
	size, err := LoadSafetensorsIndex("testdata/index.json")
	if err != nil {
		t.Fatal(err)
	}
	return Input{Model: load(t, "kimi-k2.5"), WeightBytes: size, GPU: gpu(t, "RTX PRO 6000"), GPUs: 8, TP: 8, MemFraction: 0.93, HostMem: 449 * GB}
}

// TestKimiObserved compares the prediction with the device pool of the deployment docs/engines.md
// §8 reports (231,120 tokens). It does not give the fraction of
// that run; 0.93 is DESIGN.md's example. The test pins the prediction and
// bounds the error; the fraction that reproduces the observation exactly
// is computed for the record.
func TestKimiObserved(t *testing.T) {
	const observed = 231120
	p, err := Compute(kimiInput(t))
	if err != nil {
		t.Fatal(err)
	}
	got := p.Memory.MaxTotalTokens
	errPct := (float64(got) - observed) / observed * 100
	implied := ImpliedMemFraction(p.Memory.FreeBeforeWeightsBytes, p.Weights.PerRankBytes, 0, p.KV.CellBytes, observed)
	t.Logf("predicted %d vs observed %d: %+.2f%%; implied --mem-fraction-static %.4f", got, observed, errPct, implied)
	if math.Abs(errPct) > 6 {
		t.Errorf("prediction %d is %.1f%% off the observed %d", got, errPct, observed)
	}
	if implied < 0.9 || implied > 0.95 {
		t.Errorf("implied fraction %.4f outside the 0.90-0.95 band runs use", implied)
	}
	// SGLang's own auto fraction on this card (docs/engines.md §1.6).
	if f := SGLangAutoMemFraction(97887*MiB, 8); f != 0.848 {
		t.Errorf("auto fraction = %v, want 0.848 (docs/engines.md §1.6)", f)
	}
}

func TestHiCacheRefusal(t *testing.T) {
	in := kimiInput(t)
	in.HiCache = HiCache{Enabled: true, SizeGB: 300}
	p, err := Compute(in)
	var re *RefusalError
	if !errors.As(err, &re) || !re.Has(RefuseHostCache) {
		t.Fatalf("err = %v, want a host cache refusal", err)
	}
	hc := p.HostCache
	// 300e9 // 70272 = 4269125, +1 page (docs/engines.md §2: ~4.27 M tokens per rank).
	if hc.TokensPerRank != 4269126 || hc.TotalBytes != 4269126*70272*8 {
		t.Errorf("tokens per rank %d, total %d: want 4269126 and x70272 x8", hc.TokensPerRank, hc.TotalBytes)
	}
	// Budget: 449 GB - (10 + 8x5) GiB - 44.9 GB - 8x10 GiB = 264.51 GB, 33.06 GB per rank.
	wantBudget := 449*GB - 50*GiB - 449*GB/10 - 80*GiB
	if p.Host.BudgetForCacheBytes != wantBudget {
		t.Errorf("budget = %d, want %d", p.Host.BudgetForCacheBytes, wantBudget)
	}
	if hc.MaxSafeSizeGB != 33 {
		t.Errorf("max safe size = %d, want 33 GB per rank", hc.MaxSafeSizeGB)
	}
	text := err.Error()
	for _, want := range []string{"per TP rank", "449.00 GB", "53.69 GB", "44.90 GB", "85.90 GB", "264.51 GB = 33.06 GB per rank",
		"300.00 GB per rank x 8 ranks = 2400.00 GB", "largest safe --hicache-size: 33"} {
		if !strings.Contains(text, want) {
			t.Errorf("refusal text lacks %q:\n%s", want, text)
		}
	}
	if !strings.Contains(strings.Join(p.Flags, " "), "--hicache-size 33") {
		t.Errorf("flags %v: want the safe size 33", p.Flags)
	}

	// The safe size passes, one more GB does not.
	for size, refused := range map[int]bool{33: false, 34: true} {
		in.HiCache.SizeGB = size
		_, err := Compute(in)
		if got := errors.As(err, &re) && re.Has(RefuseHostCache); got != refused {
			t.Errorf("--hicache-size %d: refused = %v, want %v (%v)", size, got, refused, err)
		}
	}
	// Ratio 2 over the device pool (docs/engines.md §2: ~462 k tokens, ~32.5 GB per rank).
	if got := HostPoolTokens(0, 2, 231120, 70272, 1); got != 462241 {
		t.Errorf("ratio-2 host tokens = %d, want 462241", got)
	}
}

func TestMemFractionRefusals(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Input)
		kind RefusalKind
		text string
	}{
		{"too high leaves no activation room", func(in *Input) { in.MemFraction = 0.97 }, RefuseActivations, "use --mem-fraction-static <= 0.946"},
		{"too low leaves no KV pool", func(in *Input) { in.MemFraction = 0.70 }, RefuseActivations, "raise --mem-fraction-static above"},
		{"weights do not fit at tp 4", func(in *Input) { in.TP, in.GPUs = 4, 4 }, RefuseWeights, "weights per rank"},
		{"one long request does not fit", func(in *Input) {
			in.Lanes = []Lane{{Name: "huge", Concurrency: 1, MaxTokens: 250000, PromptMean: 2000}}
		}, RefuseKVTooSmall, "lane huge: prompt p95 + max_tokens = 252000 tokens > max_total_num_tokens"},
		{"vllm utilization above free", func(in *Input) { in.Engine, in.MemFraction = VLLM, 0.99 }, RefuseUtilization, "largest utilization"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := kimiInput(t)
			tt.mod(&in)
			p, err := Compute(in)
			var re *RefusalError
			if !errors.As(err, &re) || !re.Has(tt.kind) {
				t.Fatalf("err = %v, want refusal %s", err, tt.kind)
			}
			if p == nil {
				t.Fatal("refused plan is nil; want the arithmetic")
			}
			if !strings.Contains(err.Error(), tt.text) {
				t.Errorf("refusal text lacks %q:\n%s", tt.text, err)
			}
		})
	}
}

func TestLanes(t *testing.T) {
	// Capacity pinned with --max-total-tokens so the arithmetic is by hand.
	in := Input{Model: load(t, "llama3-8b"), GPU: gpu(t, "h200"), MemFraction: 0.9, MaxTotalTokens: 100000,
		PromptTokens: 1000, OutputTokens: 3000,
		Lanes: []Lane{{Name: "short", Concurrency: 40, MaxTokens: 4000}, {Name: "long", Concurrency: 10, MaxTokens: 16000, OutputMean: 8000, OutputP95: 12000}}}
	p, err := Compute(in)
	if err != nil {
		t.Fatal(err)
	}
	lp := p.Lanes
	// headroom = long p95: 1000 + 12000 = 13000; usable = 87000;
	// demand = 40 x 4000 + 10 x 9000 = 250000; scale = 0.348;
	// short floor(40 x 0.348) = 13, long floor(10 x 0.348) = 3.
	got := []int{lp.Lanes[0].Recommended, lp.Lanes[1].Recommended}
	if diff := cmp.Diff([]int{13, 3}, got); diff != "" {
		t.Errorf("recommended (-want +got):\n%s\n%s", diff, strings.Join(lp.Formula, "\n"))
	}
	if lp.HeadroomTokens != 13000 || lp.UsableTokens != 87000 || lp.DemandTokens != 250000 || lp.MaxRunningRequests != 16 {
		t.Errorf("headroom %d usable %d demand %d max running %d, want 13000 87000 250000 16", lp.HeadroomTokens, lp.UsableTokens, lp.DemandTokens, lp.MaxRunningRequests)
	}
	if sum := lp.Lanes[0].KVTokens + lp.Lanes[1].KVTokens; sum > lp.UsableTokens {
		t.Errorf("lanes use %d tokens > usable %d", sum, lp.UsableTokens)
	}

	// A user cap on running requests scales lanes down further.
	in.MaxRunningRequests = 8
	p, err = Compute(in)
	if err != nil {
		t.Fatal(err)
	}
	if n := p.Lanes.Lanes[0].Recommended + p.Lanes.Lanes[1].Recommended; n > 8 {
		t.Errorf("running %d > cap 8", n)
	}
	// Everything fits: lanes get what they asked for.
	in.MaxRunningRequests, in.MaxTotalTokens = 0, 0
	in.Lanes = []Lane{{Name: "a", Concurrency: 5, MaxTokens: 2000}}
	p, err = Compute(in)
	if err != nil {
		t.Fatal(err)
	}
	if r := p.Lanes.Lanes[0].Recommended; r != 5 {
		t.Errorf("recommended %d, want the 5 asked for", r)
	}
}

func TestFlags(t *testing.T) {
	in := kimiInput(t)
	in.HiCache = HiCache{Enabled: true, SizeGB: 30}
	in.Lanes = []Lane{{Name: "short", Concurrency: 150, MaxTokens: 10240}, {Name: "long", Concurrency: 32, MaxTokens: 16384}}
	in.PromptTokens, in.OutputTokens = 1500, 4000
	p, err := Compute(in)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"--tp", "8", "--mem-fraction-static", "0.93", "--kv-cache-dtype", "auto", "--max-running-requests", "40", "--enable-hierarchical-cache", "--hicache-size", "30"}
	if diff := cmp.Diff(want, p.Flags); diff != "" {
		t.Errorf("flags (-want +got):\n%s", diff)
	}
	wantYAML := `server:
  engine: sglang
  args: ["--tp", "8", "--mem-fraction-static", "0.93", "--kv-cache-dtype", "auto", "--max-running-requests", "40", "--enable-hierarchical-cache", "--hicache-size", "30"]
`
	if diff := cmp.Diff(wantYAML, p.YAML); diff != "" {
		t.Errorf("yaml (-want +got):\n%s", diff)
	}

	v, err := Compute(Input{Model: load(t, "llama3-70b"), GPU: gpu(t, "h100"), TP: 4, DP: 2, Engine: VLLM, KVDtype: "bf16",
		Lanes: []Lane{{Name: "a", Concurrency: 64, MaxTokens: 2048, PromptMean: 512}}})
	if err != nil {
		t.Fatal(err)
	}
	wantV := []string{"--tensor-parallel-size", "4", "--data-parallel-size", "2", "--gpu-memory-utilization", "0.9", "--kv-cache-dtype", "bfloat16", "--block-size", "16", "--max-num-seqs", "32"}
	if diff := cmp.Diff(wantV, v.Flags); diff != "" {
		t.Errorf("vllm flags (-want +got):\n%s", diff)
	}
}

func TestInputErrors(t *testing.T) {
	base := func() Input { return Input{Model: load(t, "llama3-8b"), GPU: gpu(t, "h100")} }
	tests := []struct {
		name string
		mod  func(*Input)
		want string
	}{
		{"gpus mismatch", func(in *Input) { in.GPUs, in.TP = 8, 4 }, "gpus 8 != tp 4 x dp 1"},
		{"bad kv dtype", func(in *Input) { in.KVDtype = "int3" }, "kv dtype"},
		{"hicache on vllm", func(in *Input) { in.Engine, in.HiCache.Enabled, in.HostMem = VLLM, true, GB }, "SGLang feature"},
		{"hicache without host", func(in *Input) { in.HiCache.Enabled = true }, "host RAM"},
		{"fraction 1", func(in *Input) { in.MemFraction = 1 }, "mem fraction"},
	}
	for _, tt := range tests {
		in := base()
		tt.mod(&in)
		p, err := Compute(in)
		if err == nil || !strings.Contains(err.Error(), tt.want) || p != nil {
			t.Errorf("%s: plan %v err %v, want nil plan and %q", tt.name, p != nil, err, tt.want)
		}
	}
}

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in   string
		want int64
	}{
		{"96GB", 96 * GB}, {"95.59GiB", int64(math.Round(95.59 * float64(GiB)))}, {"97887MiB", 97887 * MiB},
		{"449GB", 449 * GB}, {"449G", 449 * GB}, {"1024", 1024}, {"1.5 GiB", 3 * GiB / 2}, {"2TB", 2000 * GB},
	}
	for _, tt := range tests {
		got, err := ParseBytes(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", "GB", "12XB", "-3GB"} {
		if _, err := ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q): want an error", bad)
		}
	}
}

func TestParseGPU(t *testing.T) {
	tests := []struct {
		in       string
		wantMiB  int64
		wantNote bool
	}{
		{"RTX-PRO-6000", 97887, false}, {"rtx pro 6000", 97887, false}, {"NVIDIA H100", 81559, false},
		{"H200", 143771, false}, {"a100-80gb", 81920, false}, {"A100-40GB", 40960, false}, {"L40S", 46068, false}, {"B200", 183359, false},
		{"97887MiB", 97887, false}, {"96GB", 0, true},
	}
	for _, tt := range tests {
		g, notes, err := ParseGPU(tt.in)
		if err != nil {
			t.Errorf("ParseGPU(%q): %v", tt.in, err)
			continue
		}
		if tt.wantMiB > 0 && g.MemBytes != tt.wantMiB*MiB {
			t.Errorf("ParseGPU(%q) = %d MiB, want %d", tt.in, g.MemBytes/MiB, tt.wantMiB)
		}
		if (len(notes) > 0) != tt.wantNote {
			t.Errorf("ParseGPU(%q) notes %v, want note %v", tt.in, notes, tt.wantNote)
		}
	}
	if _, _, err := ParseGPU("GTX-9999"); err == nil {
		t.Error("unknown GPU name: want an error")
	}
}

func TestParseLane(t *testing.T) {
	tests := []struct {
		in   string
		want Lane
		err  bool
	}{
		{"short:150:10240", Lane{Name: "short", Concurrency: 150, MaxTokens: 10240}, false},
		{"long:32:16384:3000:9000", Lane{Name: "long", Concurrency: 32, MaxTokens: 16384, PromptMean: 3000, OutputMean: 9000}, false},
		{"x:1:100:10::20:", Lane{Name: "x", Concurrency: 1, MaxTokens: 100, PromptMean: 10, PromptP95: 20}, false},
		{"short:150", Lane{}, true},
		{"short:many:10", Lane{}, true},
	}
	for _, tt := range tests {
		got, err := ParseLane(tt.in)
		if (err != nil) != tt.err {
			t.Errorf("ParseLane(%q) err = %v, want err %v", tt.in, err, tt.err)
			continue
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("ParseLane(%q) (-want +got):\n%s", tt.in, diff)
		}
	}
}

func TestSGLangDefaultMaxRunning(t *testing.T) {
	tests := []struct {
		tokens int64
		ctx    int
		want   int
	}{
		{231120, 262144, 2048},  // clamp up to 2048
		{3000, 262144, 1500},    // then at most tokens/2
		{10000000, 32768, 4096}, // clamp down to 4096
	}
	for _, tt := range tests {
		if got := SGLangDefaultMaxRunning(tt.tokens, tt.ctx); got != tt.want {
			t.Errorf("SGLangDefaultMaxRunning(%d, %d) = %d, want %d", tt.tokens, tt.ctx, got, tt.want)
		}
	}
}

// TestGolden pins the text and JSON renderings of the Kimi hicache case.
func TestGolden(t *testing.T) {
	in := kimiInput(t)
	in.HiCache = HiCache{Enabled: true, SizeGB: 300}
	in.Lanes = []Lane{{Name: "short", Concurrency: 150, MaxTokens: 10240}, {Name: "long", Concurrency: 32, MaxTokens: 16384}}
	in.PromptTokens, in.OutputTokens = 1500, 4000
	in.Model.Name = "kimi-k2.5"
	p, _ := Compute(in)
	var b strings.Builder
	if err := p.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	js, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	for file, got := range map[string]string{"kimi-hicache.txt": b.String(), "kimi-hicache.json": string(js) + "\n"} {
		path := filepath.Join("testdata", file)
		if *update {
			if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test -update)", err)
		}
		if diff := cmp.Diff(string(want), got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", file, diff)
		}
	}
}

func BenchmarkCompute(b *testing.B) {
	m, err := LoadModelConfig("testdata/kimi-k2.5.json")
	if err != nil {
		b.Fatal(err)
	}
	g, _ := LookupGPU("rtx-pro-6000")
	in := Input{Model: m, GPU: g, TP: 8, MemFraction: 0.93, HostMem: 449 * GB, HiCache: HiCache{Enabled: true, SizeGB: 30},
		Lanes: []Lane{{Name: "short", Concurrency: 150, MaxTokens: 10240}, {Name: "long", Concurrency: 32, MaxTokens: 16384}}, PromptTokens: 1500}
	for b.Loop() {
		if _, err := Compute(in); err != nil {
			b.Fatal(err)
		}
	}
}

// TestDefaultPromptLength: a lane given without a prompt length is planned
// with DefaultPromptTokens, and the plan says it assumed it.
func TestDefaultPromptLength(t *testing.T) {
	in := Input{Model: load(t, "llama3-8b"), GPU: gpu(t, "h100"), Lanes: []Lane{{Name: "short", Concurrency: 8, MaxTokens: 2048}, {Name: "own", Concurrency: 8, MaxTokens: 2048, PromptMean: 300}}}
	p, err := Compute(in)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Lanes.Lanes[0].PromptMean; got != DefaultPromptTokens {
		t.Errorf("lane without a prompt length planned with %d tokens, want %d", got, DefaultPromptTokens)
	}
	if got := p.Lanes.Lanes[1].PromptMean; got != 300 {
		t.Errorf("lane with its own prompt length planned with %d, want 300", got)
	}
	said := false
	for _, e := range p.Estimates {
		said = said || strings.Contains(e, "prompt length: 1024 tokens assumed for lane short (")
	}
	if !said {
		t.Errorf("estimates do not say the prompt length was assumed: %q", p.Estimates)
	}
}
