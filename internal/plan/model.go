package plan

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// ModelConfig is the part of a Hugging Face config.json the planner needs.
// For multimodal checkpoints (Kimi-K2.5, Llava-style) the language model's
// fields come from the nested text_config; the top level keeps the dtype
// and quantization_config when the nested one has none.
type ModelConfig struct {
	Name         string `json:"name,omitempty"`
	Architecture string `json:"architecture,omitempty"`
	ModelType    string `json:"model_type,omitempty"`
	// Dtype is torch_dtype or dtype ("bfloat16", "float16", "float32").
	Dtype string `json:"dtype"`

	NumLayers         int  `json:"num_hidden_layers"`
	HiddenSize        int  `json:"hidden_size"`
	IntermediateSize  int  `json:"intermediate_size"`
	NumAttentionHeads int  `json:"num_attention_heads"`
	NumKVHeads        int  `json:"num_key_value_heads"`
	HeadDim           int  `json:"head_dim"`
	VocabSize         int  `json:"vocab_size"`
	TieWordEmbeddings bool `json:"tie_word_embeddings,omitempty"`
	AttentionBias     bool `json:"attention_bias,omitempty"`
	ContextLen        int  `json:"max_position_embeddings,omitempty"`

	// MLA (DeepSeek-V2/V3, Kimi-K2): set when KVLoraRank > 0.
	QLoraRank     int `json:"q_lora_rank,omitempty"`
	KVLoraRank    int `json:"kv_lora_rank,omitempty"`
	QKRopeHeadDim int `json:"qk_rope_head_dim,omitempty"`
	QKNopeHeadDim int `json:"qk_nope_head_dim,omitempty"`
	VHeadDim      int `json:"v_head_dim,omitempty"`

	// MoE. NumExperts is n_routed_experts, num_local_experts or num_experts.
	NumExperts          int `json:"n_routed_experts,omitempty"`
	NumSharedExperts    int `json:"n_shared_experts,omitempty"`
	MoEIntermediateSize int `json:"moe_intermediate_size,omitempty"`
	// SharedExpertIntermediateSize is Qwen-MoE's single shared expert width.
	SharedExpertIntermediateSize int `json:"shared_expert_intermediate_size,omitempty"`
	FirstKDenseReplace           int `json:"first_k_dense_replace,omitempty"`
	MoELayerFreq                 int `json:"moe_layer_freq,omitempty"`
	NumNextNPredictLayers        int `json:"num_nextn_predict_layers,omitempty"`

	Quant  *Quantization `json:"quantization,omitempty"`
	Vision *VisionConfig `json:"vision,omitempty"`
}

// Quantization is a checkpoint's quantization_config, reduced to what
// decides bytes per parameter and the KV-cache dtype.
type Quantization struct {
	Method string `json:"quant_method"`
	// Bits and Type describe quantized Linear weights ("int" 4, "float" 8).
	Bits int    `json:"bits"`
	Type string `json:"type,omitempty"`
	// GroupSize is the number of weights sharing one scale (0: per channel
	// or per tensor, scales negligible).
	GroupSize int  `json:"group_size,omitempty"`
	Symmetric bool `json:"symmetric"`
	// BlockSize is fp8 block quantization's weight_block_size (DeepSeek-V3:
	// 128x128 with one float32 scale per block).
	BlockSize [2]int `json:"block_size,omitempty"`
	// Ignore lists modules kept unquantized: exact names or "re:" regexes
	// (compressed-tensors ignore, modules_to_not_convert, ignored_layers).
	Ignore []string `json:"ignore,omitempty"`
	// KVCacheFP8 is kv_cache_quant_algo == "FP8": SGLang's auto KV dtype
	// then becomes fp8_e4m3 (docs/engines.md §1.4).
	KVCacheFP8 bool `json:"kv_cache_fp8,omitempty"`
	// KVCacheScheme is true when compressed-tensors declares a
	// kv_cache_scheme; how SGLang's auto treats it was not checked.
	KVCacheScheme bool `json:"kv_cache_scheme,omitempty"`
}

// VisionConfig is the vision tower's shape, used only to estimate its
// weights (replicated on every rank).
type VisionConfig struct {
	NumLayers        int `json:"num_layers"`
	HiddenSize       int `json:"hidden_size"`
	IntermediateSize int `json:"intermediate_size"`
	PatchSize        int `json:"patch_size,omitempty"`
}

// IsMLA reports whether the model uses multi-head latent attention.
func (m *ModelConfig) IsMLA() bool { return m.KVLoraRank > 0 }

// IsMoE reports whether the model has routed experts.
func (m *ModelConfig) IsMoE() bool { return m.NumExperts > 0 }

// LoadModelConfig reads a Hugging Face config.json.
func LoadModelConfig(path string) (ModelConfig, error) {
	if gguf, err := isGGUF(path); err != nil {
		return ModelConfig{}, err
	} else if gguf {
		return ModelConfig{}, fmt.Errorf("model config %s is a GGUF model file, served by llama-server: %w", path, ErrLlamaCpp)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return ModelConfig{}, fmt.Errorf("read model config: %w", err)
	}
	m, err := ParseModelConfig(b)
	if err != nil {
		return ModelConfig{}, fmt.Errorf("model config %s: %w", path, err)
	}
	if m.Name == "" {
		m.Name = path
	}
	return m, nil
}

// LoadSafetensorsIndex returns metadata.total_size from a
// model.safetensors.index.json: the checkpoint's tensor bytes.
func LoadSafetensorsIndex(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read safetensors index: %w", err)
	}
	var idx struct {
		Metadata struct {
			TotalSize json.Number `json:"total_size"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		return 0, fmt.Errorf("safetensors index %s: %w", path, err)
	}
	n, err := idx.Metadata.TotalSize.Float64()
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("safetensors index %s: metadata.total_size missing or not a positive number", path)
	}
	return int64(n), nil
}

// ParseModelConfig decodes config.json bytes. It is lenient about key
// spellings (head_dim absent, num_local_experts vs n_routed_experts) and
// strict only about what the plan cannot do without: layers, hidden size
// and attention heads.
func ParseModelConfig(b []byte) (ModelConfig, error) {
	var top map[string]any
	if err := json.Unmarshal(b, &top); err != nil {
		return ModelConfig{}, fmt.Errorf("decode: %w", err)
	}
	text := top
	if tc, ok := top["text_config"].(map[string]any); ok {
		text = tc
	}
	var m ModelConfig
	m.Name = str(top, "_name_or_path")
	m.ModelType = str(top, "model_type")
	if a, ok := top["architectures"].([]any); ok && len(a) > 0 {
		m.Architecture, _ = a[0].(string)
	}
	m.Dtype = firstStr(text, "torch_dtype", "dtype")
	if m.Dtype == "" {
		m.Dtype = firstStr(top, "torch_dtype", "dtype")
	}
	if m.Dtype == "" {
		m.Dtype = "bfloat16"
	}

	m.NumLayers = num(text, "num_hidden_layers", "n_layer", "num_layers")
	m.HiddenSize = num(text, "hidden_size", "d_model", "n_embd")
	m.IntermediateSize = num(text, "intermediate_size", "ffn_dim")
	m.NumAttentionHeads = num(text, "num_attention_heads", "n_head")
	m.NumKVHeads = num(text, "num_key_value_heads", "num_kv_heads")
	if m.NumKVHeads == 0 {
		m.NumKVHeads = m.NumAttentionHeads // plain MHA configs omit it
	}
	m.HeadDim = num(text, "head_dim")
	if m.HeadDim == 0 && m.NumAttentionHeads > 0 {
		m.HeadDim = m.HiddenSize / m.NumAttentionHeads
	}
	m.VocabSize = num(text, "vocab_size")
	if m.VocabSize == 0 {
		m.VocabSize = num(top, "vocab_size")
	}
	m.TieWordEmbeddings = boolean(text, "tie_word_embeddings") || (text["tie_word_embeddings"] == nil && boolean(top, "tie_word_embeddings"))
	m.AttentionBias = boolean(text, "attention_bias") || boolean(text, "qkv_bias")
	m.ContextLen = num(text, "max_position_embeddings", "n_positions", "max_seq_len")

	m.QLoraRank = num(text, "q_lora_rank")
	m.KVLoraRank = num(text, "kv_lora_rank")
	m.QKRopeHeadDim = num(text, "qk_rope_head_dim")
	m.QKNopeHeadDim = num(text, "qk_nope_head_dim")
	m.VHeadDim = num(text, "v_head_dim")

	m.NumExperts = num(text, "n_routed_experts", "num_local_experts", "num_experts")
	m.NumSharedExperts = num(text, "n_shared_experts")
	m.MoEIntermediateSize = num(text, "moe_intermediate_size")
	if m.NumExperts > 0 && m.MoEIntermediateSize == 0 {
		m.MoEIntermediateSize = m.IntermediateSize // Mixtral: experts use intermediate_size
	}
	m.SharedExpertIntermediateSize = num(text, "shared_expert_intermediate_size")
	m.FirstKDenseReplace = num(text, "first_k_dense_replace")
	m.MoELayerFreq = num(text, "moe_layer_freq", "decoder_sparse_step")
	if m.MoELayerFreq == 0 {
		m.MoELayerFreq = 1
	}
	m.NumNextNPredictLayers = num(text, "num_nextn_predict_layers")

	qc, _ := text["quantization_config"].(map[string]any)
	if qc == nil {
		qc, _ = top["quantization_config"].(map[string]any)
	}
	if qc != nil {
		q := parseQuant(qc)
		m.Quant = &q
	}
	if vc, ok := top["vision_config"].(map[string]any); ok {
		v := VisionConfig{
			// Kimi-K2.5's MoonViT uses a vt_ prefix (docs/engines.md §8).
			NumLayers:        num(vc, "vt_num_hidden_layers", "num_hidden_layers", "depth"),
			HiddenSize:       num(vc, "vt_hidden_size", "hidden_size", "embed_dim"),
			IntermediateSize: num(vc, "vt_intermediate_size", "intermediate_size"),
			PatchSize:        num(vc, "patch_size"),
		}
		if v.NumLayers > 0 && v.HiddenSize > 0 {
			m.Vision = &v
		}
	}

	var missing []string
	for _, f := range []struct {
		name string
		v    int
	}{{"num_hidden_layers", m.NumLayers}, {"hidden_size", m.HiddenSize}, {"num_attention_heads", m.NumAttentionHeads}} {
		if f.v <= 0 {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return m, fmt.Errorf("missing %s", strings.Join(missing, ", "))
	}
	if m.IsMLA() && m.QKRopeHeadDim == 0 {
		return m, fmt.Errorf("kv_lora_rank set but qk_rope_head_dim missing")
	}
	return m, nil
}

func parseQuant(qc map[string]any) Quantization {
	q := Quantization{Method: strings.ToLower(firstStr(qc, "quant_method", "quant_algo"))}
	if strings.EqualFold(str(qc, "kv_cache_quant_algo"), "FP8") {
		q.KVCacheFP8 = true
	}
	if qc["kv_cache_scheme"] != nil {
		q.KVCacheScheme = true
	}
	q.Ignore = strList(qc, "ignore", "modules_to_not_convert", "ignored_layers")
	switch {
	case q.Method == "compressed-tensors":
		if groups, ok := qc["config_groups"].(map[string]any); ok {
			for _, g := range groups {
				gm, _ := g.(map[string]any)
				w, _ := gm["weights"].(map[string]any)
				if w == nil {
					continue
				}
				q.Bits = num(w, "num_bits")
				q.Type = str(w, "type")
				q.Symmetric = boolean(w, "symmetric")
				if str(w, "strategy") == "group" || str(w, "strategy") == "tensor_group" {
					q.GroupSize = num(w, "group_size")
				}
				break // one weight scheme is all this estimator models
			}
		}
	case strings.Contains(q.Method, "fp8"):
		q.Bits, q.Type, q.Symmetric = 8, "float", true
		if bs, ok := qc["weight_block_size"].([]any); ok && len(bs) == 2 {
			a, _ := bs[0].(float64)
			b, _ := bs[1].(float64)
			q.BlockSize = [2]int{int(a), int(b)}
		}
	default: // gptq, awq and friends: bits + group_size with zero points
		q.Bits = num(qc, "bits", "w_bit", "num_bits")
		q.Type = "int"
		q.GroupSize = num(qc, "group_size", "q_group_size")
		q.Symmetric = boolean(qc, "sym")
	}
	return q
}

func str(m map[string]any, k string) string {
	s, _ := m[k].(string)
	return s
}

func firstStr(m map[string]any, keys ...string) string {
	for _, k := range keys {
		if s := str(m, k); s != "" {
			return s
		}
	}
	return ""
}

func num(m map[string]any, keys ...string) int {
	for _, k := range keys {
		if f, ok := m[k].(float64); ok {
			return int(f)
		}
	}
	return 0
}

func boolean(m map[string]any, k string) bool {
	b, _ := m[k].(bool)
	return b
}

func strList(m map[string]any, keys ...string) []string {
	var out []string
	for _, k := range keys {
		if a, ok := m[k].([]any); ok {
			for _, v := range a {
				if s, ok := v.(string); ok {
					out = append(out, s)
				}
			}
		}
	}
	return out
}
