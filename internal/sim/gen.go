package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// genRequest is the part of an OpenAI chat or completions request the
// simulator reads; everything else (sampling extras) is accepted and ignored.
type genRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Role             string          `json:"role"`
		Content          json.RawMessage `json:"content"`
		ReasoningContent json.RawMessage `json:"reasoning_content"`
		ToolCalls        json.RawMessage `json:"tool_calls"`
	} `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Tools              json.RawMessage `json:"tools"`
	ChatTemplateKwargs map[string]any  `json:"chat_template_kwargs"`
	// Seed varies the answer to the same prompt, as a sampling seed does.
	Seed *int64 `json:"seed"`
	// Priority orders the queue when priority scheduling is on
	// (Config.PriorityScheduling).
	Priority *int `json:"priority"`
	// Token ids, asked the way vLLM or SGLang asks (docs/engines.md §10).
	ReturnTokenIDs  bool `json:"return_token_ids"`
	ReturnInputIDs  bool `json:"return_input_ids_in_sglext"`
	ReturnOutputIDs bool `json:"return_output_ids_in_sglext"`
}

// idMode is how a chat request asked for token ids.
func (in *genRequest) idMode(kind reqKind) int {
	switch {
	case kind != kindChat:
		return idsNone
	case in.ReturnTokenIDs:
		return idsVLLM
	case in.ReturnInputIDs || in.ReturnOutputIDs:
		return idsSGLang
	}
	return idsNone
}

// reqFaults is what per-request faults do to one request.
type reqFaults struct {
	status      int // an error status instead of an answer
	message     string
	resetAt     int // tokens before a TCP reset; -1 none
	malformedAt int // tokens before a malformed chunk; -1 none
	cutAt       int // tokens before the connection is cut; -1 none
}

// requestFaults assigns per-request faults to the n-th request.
func (s *Server) requestFaults(n int64) reqFaults {
	out := reqFaults{resetAt: -1, malformedAt: -1, cutAt: -1}
	for _, f := range s.reqFaults {
		if f.AfterRequests > 0 {
			if n <= int64(f.AfterRequests) {
				continue
			}
		} else if !f.fired.Load() {
			continue
		}
		claimed := false
		for {
			left := f.remaining.Load()
			if left <= 0 {
				break
			}
			if f.remaining.CompareAndSwap(left, left-1) {
				claimed = true
				break
			}
		}
		if !claimed {
			continue
		}
		switch f.Kind {
		case FaultError:
			out.status, out.message = f.Status, f.Message
		case FaultReset:
			out.resetAt = f.Tokens
		case FaultMalformed:
			out.malformedAt = f.Tokens
		}
	}
	return out
}

func (s *Server) generate(w http.ResponseWriter, r *http.Request, kind reqKind) {
	if s.state.Load() == stateDead {
		panic(http.ErrAbortHandler)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 256<<20))
	if err != nil {
		return
	}
	if s.cfg.RecordRequest != nil {
		s.cfg.RecordRequest(body)
	}
	var in genRequest
	if err := json.Unmarshal(body, &in); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return
	}
	if s.cfg.Engine == "vllm" && in.Model != "" && in.Model != s.cfg.modelName() {
		writeJSON(w, 404, map[string]any{"object": "error", "message": fmt.Sprintf("The model `%s` does not exist.", in.Model),
			"type": "NotFoundError", "param": nil, "code": 404})
		return
	}
	n := s.reqCount.Add(1)
	if s.throttle(w, n) || s.broken(w, n) {
		return
	}
	fl := s.requestFaults(n)
	fl.cutAt = s.cutAt(&in)
	if fl.status != 0 {
		msg := fl.message
		switch {
		case msg != "":
		case fl.status == http.StatusInternalServerError:
			msg = "Internal server error"
		default:
			msg = http.StatusText(fl.status)
		}
		writeError(w, fl.status, msg)
		return
	}
	req, thinking, tools, msg := s.buildRequest(&in, kind)
	if msg != "" {
		s.badRequest(w, msg)
		return
	}
	select {
	case s.sched.inbox <- req:
	case <-r.Context().Done():
		return
	case <-s.dead:
		panic(http.ErrAbortHandler)
	case <-s.closing:
		writeError(w, http.StatusServiceUnavailable, "server is shutting down")
		return
	}
	enc := s.newEncoder(req, kind, thinking, tools)
	if in.Stream {
		s.stream(w, r, req, enc, fl, in.StreamOptions != nil && in.StreamOptions.IncludeUsage)
		return
	}
	s.whole(w, r, req, enc, fl)
}

// promptRead is what buildRequest learns of a request's prompt.
type promptRead struct {
	h        hasher
	prefixes []prefixSeg // the hash and length after each tools block, message or 1 KB of text
	tokens   int
	ids      []int32 // the rendered prompt ids, when token ids were asked
	// a completion's prompt ids, when token ids or hidden states were asked
	completionIDs []int64
	toolName      []byte // the first tool's name, JSON-quoted; nil without tools
	thinking      bool
}

// buildRequest estimates prompt tokens, prefixes and the output plan; a
// non-empty message is a 400 error in SGLang's words.
func (s *Server) buildRequest(in *genRequest, kind reqKind) (*request, bool, []byte, string) {
	c := &s.cfg
	p := promptRead{h: newHasher(c.Seed), thinking: c.Reasoning == "always"}
	// With token ids asked, the prompt's length is its rendered ids'.
	if in.idMode(kind) != idsNone {
		p.ids = make([]int32, 0, 256)
	}
	var msg string
	if kind == kindChat {
		msg = p.readChat(in, c)
	} else {
		msg = p.readCompletion(in, c)
	}
	if msg != "" {
		return nil, false, nil, msg
	}
	if p.ids != nil {
		p.ids = generationPrompt(p.ids)
		p.tokens = len(p.ids)
	}
	tokens := max(p.tokens, 1)
	if n := c.slotContext(); n > 0 {
		return s.slotRequest(in, kind, tokens, n, p.h.h, p.prefixes, p.ids, p.thinking, p.toolName)
	}
	maxNew, msg := maxNewTokens(in, c, tokens)
	if msg == "" {
		msg = c.checkPriority(in.Priority)
	}
	if msg != "" {
		return nil, false, nil, msg
	}
	req, thinking, tools, msg := s.makeRequest(in, kind, tokens, maxNew, p.h.h, p.prefixes, p.ids, p.thinking, p.toolName)
	if req != nil {
		req.completionIDs = p.completionIDs
		if n := len(in.Messages); kind == kindChat && n >= 3 && in.Messages[n-1].Role == "user" && in.Messages[n-2].Role == "assistant" {
			req.laterTurn = true
			if c.MissLog != "" {
				req.sentAnswer = in.Messages[n-2].Content
			}
		}
		// vLLM's connector writes every request's hidden states; a streamed
		// answer has no kv_transfer_params to name the file, so only whole
		// completions capture here.
		req.capture = kind == kindCompletion && c.HiddenStates != "" && !in.Stream
	}
	return req, thinking, tools, msg
}

// readChat reads a chat request's tools and messages, and whether its
// template kwargs turn thinking on.
func (p *promptRead) readChat(in *genRequest, c *Config) string {
	if len(in.Messages) == 0 {
		return "messages: at least one message is required"
	}
	if msg := p.readTools(in.Tools, c); msg != "" {
		return msg
	}
	for _, m := range in.Messages {
		p.h.add([]byte(m.Role))
		p.h.add(m.Content)
		p.h.add(m.ToolCalls)
		p.tokens += estimateTokens(len(m.Content)+len(m.ToolCalls), c.BytesPerToken) + 4
		if p.ids != nil {
			reasoning := m.ReasoningContent
			if c.ChatTemplate == TemplateDropReasoning && m.Role == "assistant" {
				reasoning = nil // an earlier turn's thinking is not in the prompt
			}
			p.ids = messageIDs(p.ids, m.Role, m.Content, reasoning, m.ToolCalls)
			p.tokens = len(p.ids)
		}
		p.prefixes = append(p.prefixes, prefixSeg{p.h.h, p.tokens})
	}
	if c.Reasoning == "auto" {
		for _, k := range []string{"thinking", "enable_thinking"} {
			if v, ok := in.ChatTemplateKwargs[k].(bool); ok && v {
				p.thinking = true
			}
		}
	}
	return ""
}

// readTools reads the tools block, which a template renders before the
// messages, and the first tool's name, which a tool call answers with.
func (p *promptRead) readTools(tools json.RawMessage, c *Config) string {
	if len(tools) == 0 || string(tools) == "null" {
		return ""
	}
	var tl []struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(tools, &tl); err != nil {
		return "tools: " + err.Error()
	}
	if len(tl) == 0 {
		return ""
	}
	p.toolName, _ = json.Marshal(tl[0].Function.Name)
	p.h.add(tools)
	p.tokens += estimateTokens(len(tools), c.BytesPerToken)
	if p.ids != nil {
		p.ids = toolsIDs(p.ids, tools)
		p.tokens = len(p.ids)
	}
	p.prefixes = append(p.prefixes, prefixSeg{p.h.h, p.tokens})
	return ""
}

// readCompletion reads a completions prompt (a string, a list of strings
// or a list of token ids), with a prefix every 1 KB; it never thinks.
func (p *promptRead) readCompletion(in *genRequest, c *Config) string {
	var text []byte
	var str string
	var strs []string
	var promptIDs []int
	switch {
	case json.Unmarshal(in.Prompt, &str) == nil:
		text = []byte(str)
	case json.Unmarshal(in.Prompt, &strs) == nil:
		text = []byte(strings.Join(strs, ""))
	case json.Unmarshal(in.Prompt, &promptIDs) == nil:
		text = []byte(fmt.Sprint(promptIDs))
		p.tokens = len(promptIDs)
	default:
		return "prompt: want a string, a list of strings or a list of token ids"
	}
	for off := 0; off < len(text); off += 1024 {
		p.h.add(text[off:min(off+1024, len(text))])
		t := estimateTokens(min(off+1024, len(text)), c.BytesPerToken)
		if promptIDs != nil {
			t = len(promptIDs) * min(off+1024, len(text)) / len(text)
		}
		p.prefixes = append(p.prefixes, prefixSeg{p.h.h, t})
	}
	if promptIDs == nil {
		p.tokens = estimateTokens(len(text), c.BytesPerToken)
	}
	if in.ReturnTokenIDs || c.HiddenStates != "" {
		p.completionIDs = completionIDs(promptIDs, text)
		p.tokens = len(p.completionIDs)
	}
	p.thinking = false
	return ""
}

// completionIDs are a completion prompt's ids: as sent, or the text's.
func completionIDs(sent []int, text []byte) []int64 {
	if sent == nil {
		for _, id := range textIDs(nil, string(text)) {
			sent = append(sent, int(id))
		}
	}
	out := make([]int64, len(sent))
	for i, id := range sent {
		out[i] = int64(id)
	}
	return out
}

// maxNewTokens checks the prompt fits the context and the KV pool and
// returns how many tokens the request may generate; a non-empty message is
// the engine's 400 error.
func maxNewTokens(in *genRequest, c *Config, tokens int) (int, string) {
	pool := c.kvTokens()
	if tokens >= c.ContextLen {
		return 0, fmt.Sprintf("The input (%d tokens) is longer than the model's context length (%d tokens).", tokens, c.ContextLen)
	}
	if tokens >= pool {
		return 0, fmt.Sprintf("Input length (%d tokens) exceeds the maximum allowed length (%d tokens). Use a shorter input or enable --allow-auto-truncate.", tokens, pool-1)
	}
	maxNew := c.DefaultMaxTokens
	if in.MaxCompletionTokens != nil {
		maxNew = *in.MaxCompletionTokens
	} else if in.MaxTokens != nil {
		maxNew = *in.MaxTokens
	} else if maxNew == 0 {
		maxNew = c.ContextLen - tokens
	}
	if maxNew < 1 {
		return 0, fmt.Sprintf("max_tokens must be at least 1, got %d.", maxNew)
	}
	if tokens+maxNew > c.ContextLen {
		return 0, fmt.Sprintf("Requested token count exceeds the model's maximum context length of %d tokens. You requested a total of %d tokens: %d tokens from the input messages and %d tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.",
			c.ContextLen, tokens+maxNew, tokens, maxNew)
	}
	return maxNew, ""
}

// makeRequest is the request of a prompt that passed the engine's checks.
func (s *Server) makeRequest(in *genRequest, kind reqKind, tokens, maxNew int, hash uint64, prefixes []prefixSeg,
	ids []int32, thinking bool, toolName []byte) (*request, bool, []byte, string) {
	c := &s.cfg
	seed := hash
	if in.Seed != nil {
		// The answer, not the prompt's prefix hashes: the cache still
		// shares the prompt between samples of one prompt.
		seed = splitmix64(seed ^ uint64(*in.Seed)*0x9e3779b97f4a7c15)
	}
	req := &request{
		id:        fmt.Sprintf("%016x%016x", seed, s.nextID.Add(1)),
		kind:      kind,
		prompt:    tokens,
		prefixes:  prefixes,
		maxNew:    maxNew,
		plan:      planOutput(c, seed, maxNew, thinking, toolName != nil),
		seed:      seed,
		arrived:   time.Now(),
		notify:    make(chan struct{}, 1),
		idMode:    in.idMode(kind),
		promptIDs: ids,
		sendIn:    in.ReturnTokenIDs || in.ReturnInputIDs,
		sendOut:   in.ReturnTokenIDs || in.ReturnOutputIDs,
	}
	if in.Priority != nil {
		req.priority = *in.Priority
	}
	return req, thinking, toolName, ""
}

// encoder builds SGLang-shaped SSE chunks by appending bytes; the tokens
// are JSON-safe so nothing is escaped per token.
type encoder struct {
	base     []byte // data: {"id":..,"object":..,"created":..,"model":..,
	chat     bool
	seed     uint64
	plan     outputPlan
	toolName []byte
	callID   string
	req      *request // for the token ids it asked for
	engine   string   // whose stop token rules apply (stopTokens)
}

func (s *Server) newEncoder(r *request, kind reqKind, thinking bool, toolName []byte) *encoder {
	obj := "chat.completion.chunk"
	if kind == kindCompletion {
		obj = "text_completion"
	}
	model, _ := json.Marshal(s.cfg.modelName())
	b := []byte(`data: {"id":"` + r.id + `","object":"` + obj + `","created":` + strconv.FormatInt(time.Now().Unix(), 10) + `,"model":`)
	b = append(b, model...)
	b = append(b, ',')
	return &encoder{base: b, chat: kind == kindChat, seed: r.seed, plan: r.plan, toolName: toolName, callID: fmt.Sprintf("call_%016x", r.seed), req: r, engine: s.cfg.Engine}
}

const chunkTail = `,"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}` + "\n\n"

func (e *encoder) first(b []byte) []byte {
	b = append(b, e.base...)
	if e.req.idMode == idsVLLM && e.req.sendIn {
		b = append(b, `"prompt_token_ids":`...)
		b = appendIDs(b, e.req.promptIDs)
		b = append(b, ',')
	}
	return append(b, `"choices":[{"index":0,"delta":{"role":"assistant","content":"","reasoning_content":null,"tool_calls":null}`+chunkTail...)
}

// tail ends a chat chunk carrying tokens from..to-1, with their ids when
// the request asked for them the vLLM way.
func (e *encoder) tail(b []byte, from, to int) []byte {
	if e.req.idMode != idsVLLM || !e.req.sendOut {
		return append(b, chunkTail...)
	}
	b = append(b, `,"logprobs":null,"finish_reason":null,"matched_stop":null,"token_ids":`...)
	b = outputIDs(b, e.seed, from, to)
	return append(b, `}],"usage":null}`+"\n\n"...)
}

// sglext appends SGLang's response-level chunk with the token ids of an
// answer of n tokens, when the request asked for them that way.
func (e *encoder) sglext(b []byte, n int) []byte {
	if e.req.idMode != idsSGLang {
		return b
	}
	b = append(b, e.base...)
	b = append(b, `"choices":[],"usage":null,"sglext":{`...)
	if e.req.sendIn {
		b = append(b, `"input_ids":`...)
		b = appendIDs(b, e.req.promptIDs)
		if e.req.sendOut {
			b = append(b, ',')
		}
	}
	if e.req.sendOut {
		b = append(b, `"output_ids":[`...)
		b = appendIDs(b, answerIDs(e.seed, n, e.stops()))
		b = append(b, ']')
	}
	return append(b, "}}\n\n"...)
}

// part is token i's kind: 0 content, 1 reasoning, 2 tool-call arguments.
func (e *encoder) part(i int) int {
	switch {
	case e.chat && e.plan.toolStart >= 0 && i >= e.plan.toolStart:
		return 2
	case e.chat && i < e.plan.reasoning:
		return 1
	}
	return 0
}

// toolArgs is token i's piece of the tool call's JSON arguments, escaped
// for a JSON string; the arguments close only when the call completes.
func (e *encoder) toolArgs(i int) string {
	w := tokenText(e.seed, i)
	if i == e.plan.toolStart {
		w = `{\"text\": \"` + strings.TrimPrefix(w, " ")
	}
	if i == e.plan.target-1 && e.plan.finish == "tool_calls" {
		w += `\"}`
	}
	return w
}

// tokens appends one chunk carrying tokens from..to-1, which must all be
// of one part and, for a tool call, not start it unless from does (SGLang
// with --stream-interval N sends N tokens' text per chunk).
func (e *encoder) tokens(b []byte, from, to int) []byte {
	if to-from == 1 {
		return e.token(b, from)
	}
	b = append(b, e.base...)
	text := func(b []byte) []byte {
		for i := from; i < to; i++ {
			if e.part(i) == 2 {
				b = append(b, e.toolArgs(i)...)
			} else {
				b = append(b, tokenText(e.seed, i)...)
			}
		}
		return b
	}
	if !e.chat {
		b = append(b, `"choices":[{"index":0,"text":"`...)
		b = text(b)
		return append(b, `"`+chunkTail...)
	}
	switch e.part(from) {
	case 2:
		b = append(b, `"choices":[{"index":0,"delta":{"role":null,"content":null,"reasoning_content":null,"tool_calls":[{`...)
		if from == e.plan.toolStart {
			b = append(b, `"id":"`+e.callID+`","index":0,"type":"function","function":{"name":`...)
			b = append(b, e.toolName...)
			b = append(b, `,"arguments":"`...)
		} else {
			b = append(b, `"index":0,"function":{"arguments":"`...)
		}
		b = text(b)
		b = append(b, `"}}]}`...)
	case 1:
		b = append(b, `"choices":[{"index":0,"delta":{"role":null,"content":null,"reasoning_content":"`...)
		b = text(b)
		b = append(b, `","tool_calls":null}`...)
	default:
		b = append(b, `"choices":[{"index":0,"delta":{"role":null,"content":"`...)
		b = text(b)
		b = append(b, `","reasoning_content":null,"tool_calls":null}`...)
	}
	return e.tail(b, from, to)
}

// runEnd is where a chunk starting at token from may end (exclusive), at
// most n: it stops before a change of part, the tool call's start, a
// fault's token, and after max tokens.
func (e *encoder) runEnd(from, n, max int, fl reqFaults) int {
	end := from + 1
	for end < n && end-from < max && e.part(end) == e.part(from) && end != e.plan.toolStart && end != fl.resetAt && end != fl.malformedAt && end != fl.cutAt {
		end++
	}
	return end
}

func (e *encoder) token(b []byte, i int) []byte {
	b = append(b, e.base...)
	if !e.chat {
		b = append(b, `"choices":[{"index":0,"text":"`...)
		b = append(b, tokenText(e.seed, i)...)
		return append(b, `"`+chunkTail...)
	}
	switch e.part(i) {
	case 2:
		b = append(b, `"choices":[{"index":0,"delta":{"role":null,"content":null,"reasoning_content":null,"tool_calls":[{`...)
		if i == e.plan.toolStart {
			b = append(b, `"id":"`+e.callID+`","index":0,"type":"function","function":{"name":`...)
			b = append(b, e.toolName...)
			b = append(b, `,"arguments":"`...)
		} else {
			b = append(b, `"index":0,"function":{"arguments":"`...)
		}
		b = append(b, e.toolArgs(i)...)
		b = append(b, `"}}]}`...)
	case 1:
		b = append(b, `"choices":[{"index":0,"delta":{"role":null,"content":null,"reasoning_content":"`...)
		b = append(b, tokenText(e.seed, i)...)
		b = append(b, `","tool_calls":null}`...)
	default:
		b = append(b, `"choices":[{"index":0,"delta":{"role":null,"content":"`...)
		b = append(b, tokenText(e.seed, i)...)
		b = append(b, `","reasoning_content":null,"tool_calls":null}`...)
	}
	return e.tail(b, i, i+1)
}

// eosID is Kimi-K2.5's end-of-turn token, reported as matched_stop.
const eosID = 163586

func matchedStop(reason string) string {
	if reason == "stop" {
		return strconv.Itoa(eosID)
	}
	return "null"
}

// stops is how many stop tokens end the finished answer (stopTokens).
func (e *encoder) stops() int { return stopTokens(e.engine, e.req.finishReason) }

// finish writes the chunk with the finish reason; vLLM sends the stop
// token's id in it, the token having no text.
func (e *encoder) finish(b []byte, reason string) []byte {
	b = append(b, e.base...)
	if e.chat {
		b = append(b, `"choices":[{"index":0,"delta":{"role":null,"content":null,"reasoning_content":null,"tool_calls":null}`...)
	} else {
		b = append(b, `"choices":[{"index":0,"text":""`...)
	}
	b = append(b, `,"logprobs":null,"finish_reason":"`+reason+`","matched_stop":`+matchedStop(reason)...)
	if e.req.idMode == idsVLLM && e.req.sendOut {
		b = append(b, `,"token_ids":`...)
		b = appendIDs(b, answerIDs(e.seed, 0, stopTokens(e.engine, reason)))
	}
	return append(b, `}],"usage":null}`+"\n\n"...)
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	TotalTokens         int `json:"total_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	ReasoningTokens int `json:"reasoning_tokens"`
}

func (e *encoder) usage(r *request, n int) usage {
	u := usage{PromptTokens: r.prompt, CompletionTokens: n + e.stops(), TotalTokens: r.prompt + n + e.stops(), ReasoningTokens: min(e.plan.reasoning, n)}
	if !e.chat {
		u.ReasoningTokens = 0
	}
	u.PromptTokensDetails.CachedTokens = r.cached
	return u
}

func (s *Server) stream(w http.ResponseWriter, r *http.Request, req *request, enc *encoder, fl reqFaults, includeUsage bool) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	buf := make([]byte, 0, 4096)
	if enc.chat {
		buf = enc.first(buf)
	}
	sent := 0
	for {
		if _, err := w.Write(buf); err != nil {
			req.cancel.Store(true)
			return
		}
		if err := rc.Flush(); err != nil {
			req.cancel.Store(true)
			return
		}
		buf = buf[:0]
		select {
		case <-req.notify:
		case <-r.Context().Done():
			req.cancel.Store(true)
			return
		case <-s.dead:
			panic(http.ErrAbortHandler)
		case <-s.closing:
			req.cancel.Store(true)
			panic(http.ErrAbortHandler)
		}
		done := req.done.Load()
		n := int(req.avail.Load())
		if done && req.finishReason == "abort" {
			select {
			case <-s.dead:
			default:
			}
			panic(http.ErrAbortHandler)
		}
		for sent < n {
			if sent == fl.resetAt || sent == fl.cutAt {
				break
			}
			if sent == fl.malformedAt {
				buf = append(buf, enc.base...)
				buf = append(buf, `"choices":[{"index":0,"delta":{"content":" trunc`+"\n\n"...)
				fl.malformedAt = -1
			}
			end := enc.runEnd(sent, n, max(s.cfg.StreamInterval, 1), fl)
			buf = enc.tokens(buf, sent, end)
			sent = end
		}
		if endByFault(w, buf, req, fl, sent, done) {
			return
		}
		if !done {
			continue
		}
		buf = enc.finish(buf, req.finishReason)
		if includeUsage {
			u, _ := json.Marshal(enc.usage(req, n))
			buf = append(buf, enc.base...)
			buf = append(buf, `"choices":[],"usage":`...)
			buf = append(buf, u...)
			buf = append(buf, "}\n\n"...)
		}
		buf = enc.sglext(buf, n)
		buf = append(buf, "data: [DONE]\n\n"...)
		w.Write(buf)
		rc.Flush()
		return
	}
}

// endByFault ends a stream that a reset or cut fault ends now, after
// writing buf, and reports whether it did.
func endByFault(w http.ResponseWriter, buf []byte, req *request, fl reqFaults, sent int, done bool) bool {
	switch {
	case fl.resetAt >= 0 && (sent == fl.resetAt || done):
		w.Write(buf)
		req.cancel.Store(true)
		resetConn(w)
		return true
	case fl.cutAt >= 0 && (sent == fl.cutAt || done):
		// The body ends without its chunked terminator: the client reads a
		// stream cut with no finish_reason and no [DONE].
		w.Write(buf)
		http.NewResponseController(w).Flush()
		req.cancel.Store(true)
		panic(http.ErrAbortHandler)
	}
	return false
}

// addIDs puts the token ids a whole (not streamed) chat answer of n tokens
// and its stop tokens was asked for where vLLM or SGLang put them.
func addIDs(out, choice map[string]any, req *request, n, stops int) {
	gen := answerIDs(req.seed, n, stops)
	switch req.idMode {
	case idsVLLM:
		if req.sendIn {
			out["prompt_token_ids"] = req.promptIDs
		}
		if req.sendOut {
			choice["token_ids"] = gen
		}
	case idsSGLang:
		ext := map[string]any{}
		if req.sendIn {
			ext["input_ids"] = req.promptIDs
		}
		if req.sendOut {
			ext["output_ids"] = [][]int32{gen}
		}
		out["sglext"] = ext
	}
}

// resetConn cuts the connection with a TCP RST, as a crashed peer would.
func resetConn(w http.ResponseWriter) {
	rc := http.NewResponseController(w)
	rc.Flush()
	conn, _, err := rc.Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	conn.Close()
}

func (s *Server) whole(w http.ResponseWriter, r *http.Request, req *request, enc *encoder, fl reqFaults) {
	for !req.done.Load() {
		select {
		case <-req.notify:
		case <-r.Context().Done():
			req.cancel.Store(true)
			return
		case <-s.dead:
			panic(http.ErrAbortHandler)
		case <-s.closing:
			req.cancel.Store(true)
			panic(http.ErrAbortHandler)
		}
	}
	if req.finishReason == "abort" {
		panic(http.ErrAbortHandler)
	}
	if fl.resetAt >= 0 {
		resetConn(w)
		return
	}
	if fl.cutAt >= 0 {
		panic(http.ErrAbortHandler)
	}
	out, err := s.wholeBody(req, enc)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if fl.malformedAt >= 0 {
		b, _ := json.Marshal(out)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.Write(b[:len(b)/2])
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// wholeBody is the JSON object of a whole (not streamed) answer of a
// finished request.
func (s *Server) wholeBody(req *request, enc *encoder) (map[string]any, error) {
	n := int(req.avail.Load())
	var content, reasoning, args strings.Builder
	for i := range n {
		switch enc.part(i) {
		case 2:
			args.WriteString(enc.toolArgs(i))
		case 1:
			reasoning.WriteString(tokenText(req.seed, i))
		default:
			content.WriteString(tokenText(req.seed, i))
		}
	}
	created := time.Now().Unix()
	var ms any
	if req.finishReason == "stop" {
		ms = eosID
	}
	var choice map[string]any
	obj := "chat.completion"
	if enc.chat {
		msg := map[string]any{"role": "assistant", "content": content.String(), "reasoning_content": nil, "tool_calls": nil}
		if reasoning.Len() > 0 {
			msg["reasoning_content"] = reasoning.String()
		}
		if args.Len() > 0 {
			var name string
			json.Unmarshal(enc.toolName, &name)
			// The arguments were escaped for a JSON string; undo that here.
			a := strings.ReplaceAll(args.String(), `\"`, `"`)
			msg["tool_calls"] = []any{map[string]any{"id": enc.callID, "index": 0, "type": "function",
				"function": map[string]any{"name": name, "arguments": a}}}
		}
		choice = map[string]any{"index": 0, "message": msg, "logprobs": nil, "finish_reason": req.finishReason, "matched_stop": ms}
	} else {
		obj = "text_completion"
		choice = map[string]any{"index": 0, "text": content.String(), "logprobs": nil, "finish_reason": req.finishReason, "matched_stop": ms}
	}
	out := map[string]any{"id": req.id, "object": obj, "created": created, "model": s.cfg.modelName(),
		"choices": []any{choice}, "usage": enc.usage(req, n)}
	addIDs(out, choice, req, n, enc.stops())
	if req.kind == kindCompletion {
		return out, s.completionExtras(out, choice, req, n, enc.stops())
	}
	return out, nil
}

// completionExtras adds what vLLM adds to a completion: the prompt and
// output ids in the choice when return_token_ids asked for them
// (CompletionResponseChoice), and the hidden-state file's path in the
// top-level kv_transfer_params (CompletionResponse), written first.
func (s *Server) completionExtras(out, choice map[string]any, req *request, n, stops int) error {
	prompt := req.completionIDs
	if req.capture {
		c, err := s.newCapture(req.completionIDs)
		if err != nil {
			return err
		}
		if err := s.writeCapture(c); err != nil {
			return err
		}
		prompt = c.promptIDs
		out["id"] = strings.TrimSuffix(c.id, "-0")
		out["kv_transfer_params"] = map[string]any{"hidden_states_path": c.path}
	}
	if s.cfg.Engine != EngineVLLM || !req.sendIn {
		return nil
	}
	choice["prompt_token_ids"], choice["token_ids"] = prompt, answerIDs(req.seed, n, stops)
	return nil
}
