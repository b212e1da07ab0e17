package sim

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// handleVLLMRender is vLLM's POST /v1/chat/completions/render: a chat
// completion request rendered with the chat template and tokenized, not
// generated. It answers a GenerateRequest whose token_ids are the prompt
// the same request would be generated from (vllm/entrypoints/serve/render/
// api_router.py, serve/disagg/protocol.py; docs/engines.md §15.1); here the
// simulator's own template and ids (tokens.go), add_generation_prompt true
// unless the request says false. Config.RenderSkew makes it disagree with
// generation by one id.
func (s *Server) handleVLLMRender(w http.ResponseWriter, r *http.Request) {
	var in struct {
		genRequest
		AddGenerationPrompt *bool `json:"add_generation_prompt"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 256<<20)).Decode(&in); err != nil {
		writeError(w, http.StatusBadRequest, "render: "+err.Error())
		return
	}
	if in.Model != "" && in.Model != s.cfg.modelName() {
		writeJSON(w, 404, map[string]any{"object": "error", "message": fmt.Sprintf("The model `%s` does not exist.", in.Model),
			"type": "NotFoundError", "param": nil, "code": 404})
		return
	}
	p := promptRead{h: newHasher(s.cfg.Seed), ids: make([]int32, 0, 256)}
	if msg := p.readChat(&in.genRequest, &s.cfg); msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	ids := p.ids
	if in.AddGenerationPrompt == nil || *in.AddGenerationPrompt {
		ids = generationPrompt(ids)
	}
	if s.cfg.RenderSkew != "" && strings.Contains(lastUserText(&in.genRequest), s.cfg.RenderSkew) {
		if at := lastUserID(ids); at >= 0 {
			ids[at]++
		}
	}
	var b [16]byte
	rand.Read(b[:])
	sampling := map[string]any{}
	if in.MaxTokens != nil {
		sampling["max_tokens"] = *in.MaxTokens
	}
	writeJSON(w, http.StatusOK, map[string]any{"request_id": hex.EncodeToString(b[:]), "token_ids": ids, "features": nil,
		"sampling_params": sampling, "model": s.cfg.modelName(), "stream": false, "stream_options": nil,
		"cache_salt": nil, "priority": 0, "kv_transfer_params": nil})
}

// lastUserID is the index of the last id of the last user message's
// content in rendered ids (its end marker when it is empty); -1 without one.
func lastUserID(ids []int32) int {
	user := int32(idRole + roleIndex("user"))
	for i := len(ids) - 3; i >= 0; i-- {
		if ids[i] != idStart || ids[i+1] != user || ids[i+2] != idNL {
			continue
		}
		for j := i + 3; j < len(ids); j++ {
			if ids[j] == idEnd {
				return max(j-1, i+3)
			}
		}
	}
	return -1
}
