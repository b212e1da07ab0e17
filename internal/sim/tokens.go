package sim

import (
	"encoding/json"
	"hash/fnv"
	"strconv"
	"strings"
)

// The simulator's tokenizer, used only when a request asks for token ids:
// a chat template that renders every message as
//
//	idStart, role, idNL, content ids..., idEnd, idNL
//
// and ends the prompt with idStart, assistant, idNL, as ChatML does
// (<|im_start|>assistant\n ... <|im_end|>\n). An answer that ends by a
// stop is its words and idEnd, the token the model sampled to stop, as
// vLLM and SGLang return it (stopTokens); the idNL after it is the
// template's, so it first appears in the next turn's prompt, right after
// the answer, as Qwen's "\n" does. A word of the
// simulator's vocabulary (the generated text is nothing else) is one id,
// so an answer sent back in the next turn's history is the same ids at the
// same place, as an append-only template gives on a real server; any other
// text is one id per 4-byte piece. Ids are deterministic per text.
const (
	idStart    = 1
	idEnd      = 2
	idNL       = 3
	idRole     = 10   // + roleIndex
	idVocab    = 100  // + first index of the word in vocab
	idPiece    = 1000 // + hash of a piece of text outside the vocabulary
	pieceSpace = 1 << 16
	pieceBytes = 4
)

// The chat templates of Config.ChatTemplate.
const (
	TemplateAppendOnly    = "append-only"
	TemplateDropReasoning = "drop-reasoning"
)

// Ways a request asks for token ids (docs/engines.md §10).
const (
	idsNone   = iota
	idsVLLM   // return_token_ids: prompt_token_ids in the first chunk, token_ids per chunk
	idsSGLang // return_*_ids_in_sglext: one sglext chunk before [DONE]
)

var roles = []string{"system", "user", "assistant", "tool", "developer"}

func roleIndex(role string) int {
	for i, r := range roles {
		if r == role {
			return i
		}
	}
	return len(roles)
}

// vocabID maps a vocabulary word to its id.
var vocabID = func() map[string]int32 {
	m := make(map[string]int32, len(vocab))
	for i, w := range vocab {
		if _, ok := m[w]; !ok {
			m[w] = int32(idVocab + i)
		}
	}
	return m
}()

// tokenID is the id of token i of a response with the given seed.
func tokenID(seed uint64, i int) int32 { return vocabID[tokenText(seed, i)] }

// textIDs appends the ids of s: each piece from a space to the next one is
// a vocabulary id when it is a word of vocab, otherwise hashed pieces.
func textIDs(ids []int32, s string) []int32 {
	for len(s) > 0 {
		end := strings.IndexByte(s[1:], ' ') + 1
		if end == 0 {
			end = len(s)
		}
		p := s[:end]
		s = s[end:]
		if id, ok := vocabID[p]; ok {
			ids = append(ids, id)
			continue
		}
		for len(p) > 0 {
			n := min(pieceBytes, len(p))
			h := fnv.New32a()
			h.Write([]byte(p[:n]))
			ids = append(ids, int32(idPiece+h.Sum32()%pieceSpace))
			p = p[n:]
		}
	}
	return ids
}

// rawIDs appends the ids of a JSON value: a string's text, or the value's
// bytes (content parts, tools).
func rawIDs(ids []int32, raw json.RawMessage) []int32 {
	if len(raw) == 0 || string(raw) == "null" {
		return ids
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return textIDs(ids, s)
	}
	return textIDs(ids, string(raw))
}

// toolArgsPrefix opens the arguments of the simulator's tool calls (see
// encoder.toolArgs), once unescaped.
const toolArgsPrefix = `{"text": "`

// callIDs appends the ids of an assistant's tool calls: the argument words
// the simulator generated, so its own calls come back as the ids it sent.
func callIDs(ids []int32, raw json.RawMessage) []int32 {
	if len(raw) == 0 || string(raw) == "null" {
		return ids
	}
	var calls []struct {
		Function struct {
			Arguments string `json:"arguments"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &calls) != nil {
		return textIDs(ids, string(raw))
	}
	for _, c := range calls {
		a := c.Function.Arguments
		if rest, ok := strings.CutPrefix(a, toolArgsPrefix); ok {
			a = " " + strings.TrimSuffix(rest, `"}`)
		}
		ids = textIDs(ids, a)
	}
	return ids
}

// messageIDs appends one rendered message. An assistant message renders
// its reasoning, content and tool calls in the order they were generated.
func messageIDs(ids []int32, role string, content, reasoning, toolCalls json.RawMessage) []int32 {
	ids = append(ids, idStart, int32(idRole+roleIndex(role)), idNL)
	if role == "assistant" {
		ids = rawIDs(ids, reasoning)
		ids = rawIDs(ids, content)
		ids = callIDs(ids, toolCalls)
	} else {
		ids = rawIDs(ids, content)
		ids = textIDs(ids, string(toolCalls))
	}
	return append(ids, idEnd, idNL)
}

// toolsIDs renders the declared tools as a block before the messages.
func toolsIDs(ids []int32, tools json.RawMessage) []int32 {
	ids = append(ids, idStart, int32(idRole+len(roles)), idNL)
	ids = textIDs(ids, string(tools))
	return append(ids, idEnd, idNL)
}

// generationPrompt ends a prompt: the assistant's turn begins.
func generationPrompt(ids []int32) []int32 {
	return append(ids, idStart, int32(idRole+roleIndex("assistant")), idNL)
}

// appendIDs appends ids as a JSON array.
func appendIDs(b []byte, ids []int32) []byte {
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(id), 10)
	}
	return append(b, ']')
}

// stopTokens is how many ids an answer that finished for reason has after
// its generated words: the end token, when it ended by a stop (a tool call
// too: the engine renames the finish, the model still sampled its end
// token). vLLM and SGLang decide a stop on the last output id, already
// appended, so they return it among the completion ids and count it in
// usage.completion_tokens (docs/engines.md §10.5). A cut by max_tokens or
// an abort has none. llama-server returns no ids on chat completions; the
// simulator keeps its counts as they were (docs/engines.md §10.5).
func stopTokens(engine, reason string) int {
	if engine != EngineLlamaCpp && (reason == "stop" || reason == "tool_calls") {
		return 1
	}
	return 0
}

// answerIDs are the ids of a response's n generated tokens, then its
// stop tokens (idEnd).
func answerIDs(seed uint64, n, stops int) []int32 {
	ids := make([]int32, 0, n+stops)
	for i := range n {
		ids = append(ids, tokenID(seed, i))
	}
	for range stops {
		ids = append(ids, idEnd)
	}
	return ids
}

// outputIDs appends the ids of tokens from..to-1 of a response as a JSON array.
func outputIDs(b []byte, seed uint64, from, to int) []byte {
	b = append(b, '[')
	for i := from; i < to; i++ {
		if i > from {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(tokenID(seed, i)), 10)
	}
	return append(b, ']')
}
