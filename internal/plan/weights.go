package plan

import (
	"fmt"
	"math"
	"regexp"
	"strings"
)

// WeightPart is one class of tensors in the weight estimate.
type WeightPart struct {
	Name   string `json:"name"`
	Params int64  `json:"params"`
	// BytesPerParam includes quantization scales and zero points.
	BytesPerParam float64 `json:"bytes_per_param"`
	Format        string  `json:"format"` // "bf16", "int4 g32 (+bf16 scales)", "fp8 block 128x128"
	Bytes         int64   `json:"bytes"`  // whole checkpoint
	PerRankBytes  int64   `json:"per_rank_bytes"`
	// Replicated parts are held whole on every TP rank.
	Replicated bool `json:"replicated"`
	// Loaded is false for checkpoint tensors the engine does not load by
	// default (multi-token-prediction layers without speculative decoding).
	Loaded bool `json:"loaded"`
}

// WeightEstimate is the config-derived weight size, whole and per TP rank.
type WeightEstimate struct {
	Params int64 `json:"params"`
	// CheckpointBytes counts every part, loaded or not: comparable to a
	// safetensors index's total_size.
	CheckpointBytes int64        `json:"checkpoint_bytes"`
	LoadedBytes     int64        `json:"loaded_bytes"`
	PerRankBytes    int64        `json:"per_rank_bytes"`
	Parts           []WeightPart `json:"parts"`
	Notes           []string     `json:"notes,omitempty"`
}

// dtypeBytes is the element size of a torch dtype name. float32
// checkpoints are served in 16 bits by both engines' "auto" dtype, so they
// count 2 here.
func dtypeBytes(dtype string) (int, bool) {
	switch strings.ToLower(strings.TrimPrefix(dtype, "torch.")) {
	case "bfloat16", "bf16", "float16", "fp16", "half":
		return 2, true
	case "float32", "fp32", "float":
		return 2, false
	case "float8_e4m3fn", "float8_e5m2", "fp8", "fp8_e4m3", "fp8_e5m2":
		return 1, true
	}
	return 2, false
}

type tensorClass struct {
	name     string // part label
	module   string // representative module path, for quantization ignore rules
	params   int64
	perRank  int64 // params held by one TP rank
	linear   bool  // nn.Linear: quantizable
	loaded   bool
	isLMHead bool
}

// EstimateWeights counts parameters from the config's dimensions and
// prices them with the dtype and quantization_config. It models what
// SGLang does at TP size tp: column/row-parallel linears, vocab-parallel
// embeddings and lm_head, and experts are split 1/tp; MLA's q_a_proj and
// kv_a_proj_with_mqa, router gates, norms and the vision tower are
// replicated; GQA k/v projections keep max(1, kv_heads/tp) heads per rank.
// Expert parallelism is not modelled (experts are split like TP).
func EstimateWeights(m ModelConfig, tp int) WeightEstimate {
	if tp < 1 {
		tp = 1
	}
	h := int64(m.HiddenSize)
	T := int64(tp)
	var cls []tensorClass
	add := func(c tensorClass) {
		if c.params > 0 {
			cls = append(cls, c)
		}
	}
	split := func(p int64) int64 { return ceilDiv(p, T) }

	add(tensorClass{name: "embed_tokens", module: "model.embed_tokens", params: int64(m.VocabSize) * h, perRank: split(int64(m.VocabSize) * h), loaded: true})
	if !m.TieWordEmbeddings {
		add(tensorClass{name: "lm_head", module: "lm_head", params: int64(m.VocabSize) * h, perRank: split(int64(m.VocabSize) * h), linear: true, loaded: true, isLMHead: true})
	}

	L := int64(m.NumLayers)
	var moeLayers, denseLayers int64
	firstMoE, firstDense := -1, -1
	for i := 0; i < m.NumLayers; i++ {
		if m.IsMoE() && i >= m.FirstKDenseReplace && i%m.MoELayerFreq == 0 {
			moeLayers++
			if firstMoE < 0 {
				firstMoE = i
			}
		} else {
			denseLayers++
			if firstDense < 0 {
				firstDense = i
			}
		}
	}
	layerName := func(i int, rest string) string { return fmt.Sprintf("model.layers.%d.%s", max(i, 0), rest) }

	heads := int64(m.NumAttentionHeads)
	if m.IsMLA() {
		qkHead := int64(m.QKNopeHeadDim + m.QKRopeHeadDim)
		vHead := int64(m.VHeadDim)
		if vHead == 0 {
			vHead = int64(m.QKNopeHeadDim)
		}
		var splitP int64
		if m.QLoraRank > 0 {
			splitP += int64(m.QLoraRank) * heads * qkHead // q_b_proj
		} else {
			splitP += h * heads * qkHead // q_proj
		}
		splitP += int64(m.KVLoraRank) * heads * (int64(m.QKNopeHeadDim) + vHead) // kv_b_proj
		splitP += heads * vHead * h                                              // o_proj
		add(tensorClass{name: "attention (q_b, kv_b, o; split)", module: layerName(0, "self_attn.o_proj"), params: L * splitP, perRank: L * split(splitP), linear: true, loaded: true})
		repl := h*int64(m.QLoraRank) + h*int64(m.KVLoraRank+m.QKRopeHeadDim) // q_a_proj, kv_a_proj_with_mqa
		add(tensorClass{name: "attention (q_a, kv_a; replicated)", module: layerName(0, "self_attn.kv_a_proj_with_mqa"), params: L * repl, perRank: L * repl, linear: true, loaded: true})
	} else {
		hd := int64(m.HeadDim)
		kv := int64(m.NumKVHeads)
		qo := 2 * h * heads * hd
		if m.AttentionBias {
			qo += heads * hd
		}
		add(tensorClass{name: "attention (q, o; split)", module: layerName(0, "self_attn.q_proj"), params: L * qo, perRank: L * split(qo), linear: true, loaded: true})
		kvP := 2 * h * kv * hd
		kvPerRank := 2 * h * max(1, kv/T) * hd
		if m.AttentionBias {
			kvP += 2 * kv * hd
			kvPerRank += 2 * max(1, kv/T) * hd
		}
		add(tensorClass{name: "attention (k, v; max(1, kv_heads/tp) heads per rank)", module: layerName(0, "self_attn.k_proj"), params: L * kvP, perRank: L * kvPerRank, linear: true, loaded: true})
	}

	mlp := 3 * h * int64(m.IntermediateSize)
	add(tensorClass{name: "dense MLP", module: layerName(firstDense, "mlp.gate_proj"), params: denseLayers * mlp, perRank: denseLayers * split(mlp), linear: true, loaded: true})
	var expertLayer, sharedLayer, gateLayer int64
	if m.IsMoE() {
		expertLayer = int64(m.NumExperts) * 3 * h * int64(m.MoEIntermediateSize)
		add(tensorClass{name: "routed experts", module: layerName(firstMoE, "mlp.experts.0.gate_proj"), params: moeLayers * expertLayer, perRank: moeLayers * split(expertLayer), linear: true, loaded: true})
		sharedModule := layerName(firstMoE, "mlp.shared_experts.gate_proj")
		if m.NumSharedExperts > 0 {
			sharedLayer = int64(m.NumSharedExperts) * 3 * h * int64(m.MoEIntermediateSize)
		} else if m.SharedExpertIntermediateSize > 0 {
			sharedLayer = 3 * h * int64(m.SharedExpertIntermediateSize)
			sharedModule = layerName(firstMoE, "mlp.shared_expert.gate_proj")
		}
		add(tensorClass{name: "shared experts", module: sharedModule, params: moeLayers * sharedLayer, perRank: moeLayers * split(sharedLayer), linear: true, loaded: true})
		gateLayer = int64(m.NumExperts) * h
		// The router is a plain parameter, not an nn.Linear, in the
		// DeepSeek family: it stays in the model dtype and is replicated.
		add(tensorClass{name: "router gates (replicated)", module: layerName(firstMoE, "mlp.gate"), params: moeLayers * gateLayer, perRank: moeLayers * gateLayer, loaded: true})
	}
	norms := L*2*h + h + L*int64(m.QLoraRank+m.KVLoraRank)
	add(tensorClass{name: "norms (replicated)", module: "model.norm", params: norms, perRank: norms, loaded: true})

	if n := int64(m.NumNextNPredictLayers); n > 0 {
		// One decoder layer (MoE when the model is) plus eh_proj and norms
		// per MTP layer; in the checkpoint, loaded only for speculative decoding.
		var layer int64
		for _, c := range cls {
			if strings.HasPrefix(c.name, "attention") {
				layer += c.params / L
			}
		}
		if m.IsMoE() {
			layer += expertLayer + sharedLayer + gateLayer
		} else {
			layer += mlp
		}
		layer += 2*h*h + 4*h
		add(tensorClass{name: "MTP layers (not loaded without speculative decoding)", module: layerName(m.NumLayers, "mlp.experts.0.gate_proj"), params: n * layer, linear: true, loaded: false})
	}
	if v := m.Vision; v != nil {
		vh := int64(v.HiddenSize)
		p := int64(v.NumLayers) * (4*vh*vh + 2*vh*int64(v.IntermediateSize))
		p += 3 * int64(v.PatchSize*v.PatchSize) * vh
		add(tensorClass{name: "vision tower (replicated; projector not counted)", module: "vision_tower", params: p, perRank: p, loaded: true})
	}

	db, _ := dtypeBytes(m.Dtype)
	est := WeightEstimate{}
	if _, known := dtypeBytes(m.Dtype); !known {
		est.Notes = append(est.Notes, fmt.Sprintf("dtype %q priced at 2 bytes per parameter (16-bit serving assumed)", m.Dtype))
	}
	if m.Quant != nil && m.Quant.Bits == 0 {
		est.Notes = append(est.Notes, fmt.Sprintf("quantization method %q not modelled: weights priced at the model dtype; pass --weights-bytes", m.Quant.Method))
	}
	for _, c := range cls {
		bpp, format := bytesPerParam(m.Quant, db, c)
		part := WeightPart{
			Name:          c.name,
			Params:        c.params,
			BytesPerParam: bpp,
			Format:        format,
			Bytes:         int64(math.Round(float64(c.params) * bpp)),
			PerRankBytes:  int64(math.Round(float64(c.perRank) * bpp)),
			Replicated:    c.perRank == c.params && tp > 1,
			Loaded:        c.loaded,
		}
		est.Params += c.params
		est.CheckpointBytes += part.Bytes
		if c.loaded {
			est.LoadedBytes += part.Bytes
			est.PerRankBytes += part.PerRankBytes
		}
		est.Parts = append(est.Parts, part)
	}
	return est
}

func dtypeName(b int) string {
	if b == 1 {
		return "fp8"
	}
	return "bf16/fp16"
}

// bytesPerParam prices one tensor class under the quantization config.
func bytesPerParam(q *Quantization, db int, c tensorClass) (float64, string) {
	base := float64(db)
	if q == nil || q.Bits == 0 || !c.linear || ignored(q, c.module) {
		return base, dtypeName(db)
	}
	switch {
	case q.Method == "compressed-tensors":
		if c.isLMHead && ignored(q, "lm_head") {
			return base, dtypeName(db)
		}
		b := float64(q.Bits) / 8
		if q.GroupSize > 0 {
			b += base / float64(q.GroupSize) // one scale per group, model dtype
			if !q.Symmetric {
				b += float64(q.Bits) / 8 / float64(q.GroupSize)
			}
			return b, fmt.Sprintf("%s%d group %d (+%s scales)", q.Type, q.Bits, q.GroupSize, dtypeName(db))
		}
		return b, fmt.Sprintf("%s%d", q.Type, q.Bits)
	case strings.Contains(q.Method, "fp8"):
		if c.isLMHead {
			return base, dtypeName(db)
		}
		if q.BlockSize[0] > 0 && q.BlockSize[1] > 0 {
			return 1 + 4/float64(q.BlockSize[0]*q.BlockSize[1]), fmt.Sprintf("fp8 block %dx%d (+fp32 scales)", q.BlockSize[0], q.BlockSize[1])
		}
		return 1, "fp8"
	default: // gptq/awq: packed ints, fp16 scales and packed zeros per group
		if c.isLMHead {
			return base, dtypeName(db)
		}
		b := float64(q.Bits) / 8
		if q.GroupSize > 0 {
			b += (2 + float64(q.Bits)/8) / float64(q.GroupSize)
		}
		return b, fmt.Sprintf("int%d group %d (%s)", q.Bits, q.GroupSize, q.Method)
	}
}

// ignored applies compressed-tensors style ignore rules: "re:" patterns
// matched from the start of the module path (Python re.match), other
// entries matched as the whole name or a dotted suffix.
func ignored(q *Quantization, module string) bool {
	for _, pat := range q.Ignore {
		if rx, ok := strings.CutPrefix(pat, "re:"); ok {
			re, err := regexp.Compile("^(?:" + rx + ")")
			if err == nil && re.MatchString(module) {
				return true
			}
			continue
		}
		if module == pat || strings.HasSuffix(module, "."+pat) || strings.HasSuffix(pat, "."+module) {
			return true
		}
	}
	return false
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }
