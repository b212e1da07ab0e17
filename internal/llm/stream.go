package llm

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// maxLine bounds one SSE line; a longer one is a broken stream, not a reason
// to grow memory without limit.
const maxLine = 16 << 20

var errLineTooLong = errors.New("sse line longer than 16 MiB")

// lineReader returns SSE lines without their line ending. The returned
// slice is only valid until the next call.
type lineReader struct {
	br   *bufio.Reader
	long []byte
}

// lineBuffer is a stream's read buffer. One is held for every open stream
// (10,000 of them on a big worker), while an SSE line is a few hundred
// bytes; a longer line (vLLM's prompt token ids) goes through lineReader.long.
const lineBuffer = 2 << 10

func newLineReader() *lineReader {
	return &lineReader{br: bufio.NewReaderSize(nil, lineBuffer)}
}

// next returns the next complete line. A last line without a newline is
// dropped, as the SSE spec says: it may be a chunk cut in half.
func (l *lineReader) next() ([]byte, error) {
	line, err := l.br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		l.long = append(l.long[:0], line...)
		for err == bufio.ErrBufferFull {
			line, err = l.br.ReadSlice('\n')
			l.long = append(l.long, line...)
			if len(l.long) > maxLine {
				return nil, errLineTooLong
			}
		}
		line = l.long
	}
	if err != nil {
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// keptString decodes a string that repeats in every chunk (the model name)
// without allocating when it did not change.
type keptString string

func (k *keptString) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	if n := len(b); n >= 2 && b[0] == '"' && b[n-1] == '"' && bytes.IndexByte(b, '\\') < 0 {
		if string(b[1:n-1]) != string(*k) {
			*k = keptString(b[1 : n-1])
		}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	*k = keptString(s)
	return nil
}

// streamChunk is the part of a chat.completion.chunk the client reads; one
// value is reused for every chunk of a stream.
type streamChunk struct {
	Model keptString `json:"model"`
	// SystemFingerprint identifies the server's configuration, when it
	// sends one (OpenAI's field; optional for compatible servers).
	SystemFingerprint keptString      `json:"system_fingerprint"`
	Choices           []chunkChoice   `json:"choices"`
	Usage             *chunkUsage     `json:"usage"`
	Error             json.RawMessage `json:"error"`
	// PromptTokenIDs is vLLM's answer to return_token_ids, in the first
	// chunk only (docs/engines.md §10.1).
	PromptTokenIDs []int32 `json:"prompt_token_ids"`
	// SGLExt is SGLang's response-level extension: the token ids, once, in
	// a chunk with no choices before [DONE] (docs/engines.md §10.2).
	SGLExt *sglExt `json:"sglext"`
}

type sglExt struct {
	InputIDs  []int32   `json:"input_ids"`
	OutputIDs [][]int32 `json:"output_ids"` // one list per choice
}

type chunkChoice struct {
	Index int `json:"index"`
	Delta struct {
		Content          string `json:"content"`
		ReasoningContent string `json:"reasoning_content"`
		// vLLM's newer name for reasoning_content.
		Reasoning string          `json:"reasoning"`
		ToolCalls []chunkToolCall `json:"tool_calls"`
	} `json:"delta"`
	FinishReason string `json:"finish_reason"`
	// TokenIDs are the ids sampled for this chunk (vLLM's return_token_ids).
	TokenIDs []int32 `json:"token_ids"`
}

type chunkToolCall struct {
	Index    *int   `json:"index"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type chunkUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	ReasoningTokens     int `json:"reasoning_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails *struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
}

func (c *streamChunk) reset() {
	for i := range c.Choices {
		c.Choices[i] = chunkChoice{}
	}
	c.Choices = c.Choices[:0]
	c.Usage = nil
	c.Error = nil
	c.PromptTokenIDs = nil
	c.SGLExt = nil
}

type toolAcc struct {
	id, typ, name string
	args          strings.Builder
}

// assembler accumulates deltas into a Result.
type assembler struct {
	content, reasoning strings.Builder
	tools              []*toolAcc
	finish             string
	usage              Usage
	ttft               time.Duration
	// promptIDs and completionIDs are the token ids the server returned.
	promptIDs, completionIDs []int32
	// size is the bytes of answer kept so far, for the stream's budget.
	size int64
}

// add applies one chunk and reports whether it carried a delta.
func (a *assembler) add(c *streamChunk) bool {
	if u := c.Usage; u != nil {
		a.usage = Usage{
			PromptTokens:     u.PromptTokens,
			CompletionTokens: u.CompletionTokens,
			TotalTokens:      u.TotalTokens,
			ReasoningTokens:  u.ReasoningTokens,
		}
		if d := u.PromptTokensDetails; d != nil {
			a.usage.CachedTokens = d.CachedTokens
		}
		if d := u.CompletionTokensDetails; d != nil && a.usage.ReasoningTokens == 0 {
			a.usage.ReasoningTokens = d.ReasoningTokens
		}
	}
	if len(c.PromptTokenIDs) > 0 {
		a.promptIDs = c.PromptTokenIDs // reset gives every chunk a fresh slice
		a.size += 4 * int64(len(c.PromptTokenIDs))
	}
	if x := c.SGLExt; x != nil {
		if len(x.InputIDs) > 0 {
			a.promptIDs = x.InputIDs
		}
		if len(x.OutputIDs) > 0 {
			a.completionIDs = x.OutputIDs[0]
		}
		a.size += 4 * int64(len(x.InputIDs)+len(a.completionIDs))
	}
	delta := false
	for i := range c.Choices {
		ch := &c.Choices[i]
		if ch.Index != 0 {
			continue
		}
		a.completionIDs = append(a.completionIDs, ch.TokenIDs...)
		d := &ch.Delta
		a.size += 4*int64(len(ch.TokenIDs)) + int64(len(d.Content)+len(d.ReasoningContent)+len(d.Reasoning))
		if d.Content != "" {
			a.content.WriteString(d.Content)
			delta = true
		}
		// Some vLLM versions send the same text under both names.
		if r := d.ReasoningContent; r != "" {
			a.reasoning.WriteString(r)
			delta = true
		} else if r := d.Reasoning; r != "" {
			a.reasoning.WriteString(r)
			delta = true
		}
		for j := range d.ToolCalls {
			a.addTool(j, &d.ToolCalls[j])
			delta = true
		}
		if ch.FinishReason != "" {
			a.finish = ch.FinishReason
		}
	}
	return delta
}

func (a *assembler) addTool(pos int, t *chunkToolCall) {
	idx := pos
	if t.Index != nil {
		idx = *t.Index
	}
	if idx < 0 || idx > 1024 {
		idx = len(a.tools)
	}
	for len(a.tools) <= idx {
		a.tools = append(a.tools, &toolAcc{})
	}
	acc := a.tools[idx]
	a.size += int64(len(t.ID) + len(t.Type) + len(t.Function.Name) + len(t.Function.Arguments))
	if t.ID != "" {
		acc.id = t.ID
	}
	if t.Type != "" {
		acc.typ = t.Type
	}
	if t.Function.Name != "" {
		acc.name += t.Function.Name
	}
	acc.args.WriteString(t.Function.Arguments)
}

func (a *assembler) result(model, systemFingerprint string) Result {
	r := Result{
		Content:           a.content.String(),
		ReasoningContent:  a.reasoning.String(),
		FinishReason:      a.finish,
		Usage:             a.usage,
		Model:             model,
		SystemFingerprint: systemFingerprint,
		TTFT:              a.ttft,

		PromptTokenIDs:     a.promptIDs,
		CompletionTokenIDs: a.completionIDs,
	}
	for _, t := range a.tools {
		var tc ToolCall
		tc.ID = t.id
		tc.Type = t.typ
		if tc.Type == "" {
			tc.Type = "function"
		}
		tc.Function.Name = t.name
		tc.Function.Arguments = t.args.String()
		r.ToolCalls = append(r.ToolCalls, tc)
	}
	return r
}

var dataPrefix = []byte("data:")

// decodeChunk decodes one data line into ch with the stream's decoder, or
// returns why it cannot be used: not one JSON value, or the server's error
// event.
func decodeChunk(dec *json.Decoder, src *bytes.Reader, ch *streamChunk, data []byte) error {
	ch.reset()
	src.Reset(data)
	off := dec.InputOffset()
	err := dec.Decode(ch)
	if err == nil && dec.InputOffset()-off != int64(len(data)) {
		err = errors.New("trailing data after the JSON value")
	}
	if err != nil {
		return &Error{Class: Malformed, Msg: "chat stream: bad chunk: " + clip(data, 200), Err: err}
	}
	if len(ch.Error) > 0 && string(ch.Error) != "null" {
		e := parseErrorBody(data)
		return &Error{Class: classifyEvent(e), Msg: fmt.Sprintf("chat stream: server error (code %d): %s", e.Code, e.Msg), InStream: true}
	}
	return nil
}

// streamEnd turns a failed read of the stream into the error Chat
// returns, or nil when the choice was already finished.
func streamEnd(k *call, err error, finished bool) error {
	switch {
	case k.parent.Err() != nil:
		return k.fail("chat stream", err)
	case errors.Is(err, errLineTooLong):
		return &Error{Class: Malformed, Msg: "chat stream", Err: err}
	case finished:
		return nil
	case err == io.EOF && k.ctx.Err() == nil:
		// A server dying cuts streams: not the sample's fault.
		return &Error{Class: ServerDown, Msg: msgStreamCut}
	}
	return k.fail("chat stream", err)
}

// readStream parses the SSE body of a chat completion, within budget.
func readStream(k *call, body io.Reader, start time.Time, b budget, onDelta func(int)) (Result, error) {
	lr := readerPool.Get().(*lineReader)
	lr.br.Reset(body)
	defer func() {
		lr.br.Reset(nil)
		if cap(lr.long) > 1<<20 {
			lr.long = nil
		}
		readerPool.Put(lr)
	}()
	var (
		ch   streamChunk
		a    assembler
		done bool
		src  bytes.Reader
	)
	// One Decoder per stream keeps its scanner and decode state between
	// chunks; json.Unmarshal would rebuild them for every chunk.
	dec := json.NewDecoder(&src)
	dr := drift{since: time.Now()}
	for !done {
		line, err := lr.next()
		if err != nil {
			if err := streamEnd(k, err, a.finish != ""); err != nil {
				return Result{}, err
			}
			break // the choice is complete; only [DONE] (and maybe usage) is missing
		}
		size := a.size
		var delta bool
		delta, done, err = readLine(k, dec, &src, &ch, &a, b, line)
		if err != nil {
			return Result{}, err
		}
		// Every byte counts: what carried no token counts against the budget.
		now := time.Now()
		if err := dr.line(len(line)+1, delta || a.size > size || done, b, a.size, k.progress, now); err != nil {
			return Result{}, err
		}
		if delta {
			k.deltas++
			k.lastDelta = now
			if a.ttft == 0 {
				a.ttft = now.Sub(start)
			}
			if onDelta != nil {
				onDelta(1)
			}
		}
	}
	if done {
		// Read the chunked terminator so the connection can be reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(lr.br, 64<<10))
	}
	switch a.finish {
	case "":
		return Result{}, &Error{Class: Malformed, Msg: "chat stream: [DONE] without a finish_reason"}
	case "abort":
		return Result{}, &Error{Class: Retryable, Msg: "chat stream: server aborted the request (finish_reason abort)"}
	}
	return a.result(string(ch.Model), string(ch.SystemFingerprint)), nil
}

// readLine applies one SSE line: whether it carried a delta, whether it was
// the stream's [DONE], or the error that ends the stream.
func readLine(k *call, dec *json.Decoder, src *bytes.Reader, ch *streamChunk, a *assembler, b budget, line []byte) (delta, done bool, err error) {
	if len(line) == 0 || line[0] == ':' {
		return false, false, nil
	}
	data, ok := bytes.CutPrefix(line, dataPrefix)
	if !ok {
		return false, false, nil // event:, id:, retry: carry nothing for us
	}
	data = bytes.TrimSpace(data)
	if string(data) == "[DONE]" {
		return false, true, nil
	}
	if err := decodeChunk(dec, src, ch, data); err != nil {
		return false, false, err
	}
	delta = a.add(ch)
	return delta, false, b.check(k.deltas+btoi(delta), a.size)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
