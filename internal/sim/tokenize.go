package sim

import (
	"encoding/json"
	"net/http"
)

// The tokenizer routes, in each engine's shape (docs/engines.md §13.3):
// llama-server's POST /tokenize {"content": text} answers {"tokens": ids}
// for the text alone (post_tokenize in tools/server/server-context.cpp);
// vLLM's POST /tokenize takes a prompt or chat messages (whose template it
// applies) and answers {"count", "tokens", "max_model_len"}
// (vllm/entrypoints/openai/serving_tokenization.py). Both count as the
// simulator's prompts do (BytesPerToken), so a count here is what a chat
// request with the same text would be charged.

// tokenizeIDs are n ids standing for counted tokens.
func tokenizeIDs(n int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = idPiece + int32(i%pieceSpace)
	}
	return ids
}

func (s *Server) handleLlamaTokenize(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Content string `json:"content"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<20)).Decode(&in); err != nil {
		s.badRequest(w, "tokenize: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"tokens": tokenizeIDs(estimateTokens(len(in.Content), s.cfg.BytesPerToken))})
}

func (s *Server) handleVLLMTokenize(w http.ResponseWriter, r *http.Request) {
	var in struct {
		genRequest
		Prompt *string `json:"prompt"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<20)).Decode(&in); err != nil {
		writeError(w, http.StatusBadRequest, "tokenize: "+err.Error())
		return
	}
	p := promptRead{h: newHasher(s.cfg.Seed)}
	if in.Prompt != nil {
		p.tokens = estimateTokens(len(*in.Prompt), s.cfg.BytesPerToken)
	} else if msg := p.readChat(&in.genRequest, &s.cfg); msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"count": p.tokens, "tokens": tokenizeIDs(p.tokens), "max_model_len": s.cfg.ContextLen})
}
