package conversation

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/rawjson"
)

// Plan is a decoded body.
type Plan struct {
	Body
	raw []byte
	// walked.compact: the walk found no whitespace outside strings in the
	// body's values, so the requests built from it are compact too
	// (Members); walked.ordered: Shape can read the plan (zero after the
	// encoding/json fallback).
	walked
}

// Decode parses a sample body.
func Decode(body []byte) (*Plan, error) {
	p := &Plan{raw: body}
	var err error
	if p.Body, p.walked, err = walkBody(body, rawjson.Object); err != nil {
		p.Body, p.walked = Body{}, walked{}
		if err := json.Unmarshal(body, &p.Body); err != nil {
			return nil, fmt.Errorf("decode sample body: %w", err)
		}
	}
	return p.checked()
}

// DecodeStored is Decode for a body the store hands back: Encoder wrote
// it at ingest, so its text is JSON by construction and is split without
// checking it again (rawjson.CheckedObject). That check was the one pass
// of a conversation's first turn that grew with its history
// (BenchmarkTurnCost). The split checks the body's frame: one object with
// only whitespace after it, and its members, messages and turns quoted,
// separated and closed where they should be; seed and calls decode, role
// and name are strings. A body that fails it (cut short, a quote or
// bracket out of place, anything after the object) is decoded by Decode,
// whose error says where, and the sample is dead-lettered unsent. Not
// checked, since it would read every byte: inside strings (a bad escape,
// a raw control character, invalid UTF-8) and inside a message's content
// and tool calls and the tools (brackets are counted, not paired; numbers
// and literals are not read). Such a body splits and is sent as stored;
// the server refuses it (400), which dead-letters the sample and counts
// as a refusal for the poison guard (TestCorruptStoredBodyIsDeadLettered).
func DecodeStored(body []byte) (*Plan, error) {
	p := &Plan{raw: body}
	var err error
	if p.Body, p.walked, err = walkBody(body, rawjson.CheckedObject); err != nil {
		return Decode(body)
	}
	return p.checked()
}

// checked is p after the checks every decoded body passes.
func (p *Plan) checked() (*Plan, error) {
	if len(p.Messages) == 0 {
		return nil, errors.New("decode sample body: no messages")
	}
	if bytes.Equal(bytes.TrimSpace(p.Tools), []byte("null")) {
		p.Tools = nil
	}
	for i, t := range p.Turns {
		if len(t.Input) == 0 {
			return nil, fmt.Errorf("decode sample body: turn %d has no input", i+1)
		}
	}
	return p, nil
}

// NumTurns is how many answers the plan regenerates.
func (p *Plan) NumTurns() int { return 1 + len(p.Turns) }

// ToolNames returns the names of the declared tools.
func (p *Plan) ToolNames() []string {
	if len(p.Tools) == 0 {
		return nil
	}
	var tools []struct {
		Name     string `json:"name"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(p.Tools, &tools) != nil {
		return nil
	}
	names := make([]string, 0, len(tools))
	for _, t := range tools {
		if t.Function.Name != "" {
			names = append(names, t.Function.Name)
		} else if t.Name != "" {
			names = append(names, t.Name)
		}
	}
	return names
}

// InputBytes is the size of turn k's input, for estimating the next
// prompt's length.
func (p *Plan) InputBytes(k int) int {
	in := p.Messages
	if k > 0 && k-1 < len(p.Turns) {
		in = p.Turns[k-1].Input
	}
	n := 0
	for _, m := range in {
		n += len(m.Content) + len(m.ToolCalls)
	}
	return n
}

// request is what is sent for one turn.
type request struct {
	Messages []Message       `json:"messages"`
	Tools    json.RawMessage `json:"tools,omitempty"`
	Seed     *int64          `json:"seed,omitempty"`
}

// Request returns the request body for turn k, given the answers to turns
// 0..k-1 (len(prior) must be k). keepReasoning keeps the reasoning_content
// of earlier answers in the history.
func (p *Plan) Request(k int, prior []llm.Result, keepReasoning bool) ([]byte, error) {
	if k < 0 || k >= p.NumTurns() {
		return nil, fmt.Errorf("request for turn %d: the plan has %d turns", Ordinal(k), p.NumTurns())
	}
	if len(prior) != k {
		return nil, fmt.Errorf("request for turn %d: got %d earlier answers, want %d", Ordinal(k), len(prior), k)
	}
	if k == 0 && len(p.Turns) == 0 && p.Original == nil && p.raw != nil {
		return p.raw, nil
	}
	msgs, err := p.build(prior, keepReasoning, true)
	if err != nil {
		return nil, fmt.Errorf("request for turn %d: %w", Ordinal(k), err)
	}
	return p.encodeRequest(msgs), nil
}

// encodeRequest writes a request's messages, tools and seed as encoding/json
// writes the request struct for values as Decode and Answer leave them
// (compact raw JSON), without its re-validating and compacting every raw
// value: the history it carries grows with every turn.
func (p *Plan) encodeRequest(msgs []Message) []byte {
	e := NewEncoder()
	n := len(p.Tools) + 64
	for i := range msgs {
		n += len(msgs[i].Content) + len(msgs[i].ToolCalls) + len(msgs[i].ReasoningContent) + 64
	}
	e.buf.Grow(n)
	e.buf.WriteString(messagesKey)
	e.messages(msgs)
	e.buf.Write(p.requestTail())
	return e.buf.Bytes()
}

// messagesKey opens every request encodeRequest writes.
const messagesKey = `{"messages":`

// requestTail is what follows the messages in every request encodeRequest
// writes for p: its tools and seed, and the closing brace.
func (p *Plan) requestTail() []byte {
	var tail []byte
	if len(p.Tools) > 0 {
		tail = append(append(tail, `,"tools":`...), p.Tools...)
	}
	if p.Seed != nil {
		tail = strconv.AppendInt(append(tail, `,"seed":`...), *p.Seed, 10)
	}
	return append(tail, '}')
}

// NextRequest is Request(k+1, ...) built from prev, the request Request (or
// NextRequest) built for turn k, and res, the answer to turn k: prev's
// messages are kept as they are and res's message and turn k+1's input
// appended, so a conversation's turn costs the bytes it adds, not its
// whole history again. The bytes equal Request's for the same answers
// (TestNextRequestEqualsRequest). prev must be p's own request for turn k.
func (p *Plan) NextRequest(prev []byte, k int, res llm.Result, keepReasoning bool) ([]byte, error) {
	parts, err := p.NextParts([][]byte{prev}, k, res, keepReasoning)
	if err != nil {
		return nil, err
	}
	return bytes.Join(parts, nil), nil
}

// NextParts is NextRequest for a request in pieces, and copies none of
// it: prev is turn k's request as Request built it ([][]byte{its bytes})
// or as NextParts did, and the pieces returned are prev's, the last cut
// before the messages' closing bracket, and one new piece with the answer,
// turn k+1's input and the request's end. Joined, they are NextRequest's
// bytes (TestNextPartsEqualsRequest). prev's pieces are not changed.
func (p *Plan) NextParts(prev [][]byte, k int, res llm.Result, keepReasoning bool) ([][]byte, error) {
	if k < 0 || k+1 >= p.NumTurns() {
		return nil, fmt.Errorf("request for turn %d: the plan has %d turns", Ordinal(k+1), p.NumTurns())
	}
	tail := p.requestTail()
	var last []byte
	cut := -1 // in last: the messages' closing bracket
	if len(prev) > 0 {
		last = prev[len(prev)-1]
		cut = len(last) - len(tail) - 1
	}
	if len(prev) == 1 && cut < len(messagesKey) || cut < 0 || last[cut] != ']' || !bytes.HasPrefix(prev[0], []byte(messagesKey)) || !bytes.HasSuffix(last, tail) {
		return nil, fmt.Errorf("request for turn %d: the request given for turn %d is not one this plan built", Ordinal(k+1), Ordinal(k))
	}
	if ok, why := p.Continue(k, res); !ok {
		return nil, fmt.Errorf("request for turn %d: turn %d cannot follow turn %d: %s", Ordinal(k+1), Ordinal(k+1), Ordinal(k), why)
	}
	out := make([][]byte, len(prev)+1)
	copy(out, prev)
	out[len(prev)-1] = last[:cut:cut] // capped: nothing appends into prev
	out[len(prev)] = p.nextMessages(k, res, keepReasoning, tail)
	return out, nil
}

// nextMessages is what turn k+1's request adds to turn k's messages: ','
// and the answer res, turn k+1's input, then the closing bracket and tail.
func (p *Plan) nextMessages(k int, res llm.Result, keepReasoning bool, tail []byte) []byte {
	a := Answer(k, res, keepReasoning)
	in := link(p.Turns[k], res.ToolCalls, k)
	e := NewEncoder()
	n := len(tail) + len(a.Content) + len(a.ToolCalls) + len(a.ReasoningContent) + 64
	for i := range in {
		n += len(in[i].Content) + len(in[i].ToolCalls) + 64
	}
	e.buf.Grow(n)
	e.buf.WriteByte(',')
	e.message(&a)
	for i := range in {
		e.buf.WriteByte(',')
		e.message(&in[i])
	}
	e.buf.WriteByte(']')
	e.buf.Write(tail)
	return e.buf.Bytes()
}

// Members are the top-level members of body, turn k's request as Request
// or NextRequest built it, for a client that would otherwise walk the
// whole body to find them (llm.Request.Members); nil when body is the
// sample's own bytes (a single turn is sent as stored), when the sample's
// values are not compact (the client compacts what it walks), or when
// body is not p's request.
func (p *Plan) Members(k int, body []byte) []llm.Member {
	if !p.compact || (k == 0 && len(p.Turns) == 0 && p.Original == nil && p.raw != nil) {
		return nil
	}
	tail := p.requestTail()
	if len(body) < len(messagesKey)+len(tail) || !bytes.HasPrefix(body, []byte(messagesKey)) || !bytes.HasSuffix(body, tail) {
		return nil
	}
	return p.members(llm.Member{Key: "messages", Value: body[len(messagesKey) : len(body)-len(tail)]})
}

// MembersOf is Members for a request in pieces (NextParts): its messages
// member is in pieces too (llm.Member.Pieces), so the client sends the
// history without its being joined into one slice first.
func (p *Plan) MembersOf(k int, parts [][]byte) []llm.Member {
	if len(parts) == 1 {
		return p.Members(k, parts[0])
	}
	tail := p.requestTail()
	if !p.compact || len(parts) == 0 || !bytes.HasPrefix(parts[0], []byte(messagesKey)) || !bytes.HasSuffix(parts[len(parts)-1], tail) {
		return nil
	}
	msgs := slices.Clone(parts)
	msgs[0] = msgs[0][len(messagesKey):]
	last := msgs[len(msgs)-1]
	msgs[len(msgs)-1] = last[:len(last)-len(tail)]
	return p.members(llm.Member{Key: "messages", Pieces: msgs})
}

// members is the request's members after its messages: tools and seed.
func (p *Plan) members(messages llm.Member) []llm.Member {
	ms := []llm.Member{messages}
	if len(p.Tools) > 0 {
		ms = append(ms, llm.Member{Key: "tools", Value: p.Tools})
	}
	if p.Seed != nil {
		ms = append(ms, llm.Member{Key: "seed", Value: strconv.AppendInt(nil, *p.Seed, 10)})
	}
	return ms
}

// Conversation returns the whole conversation for the answers given (the
// first len(answers) turns): every turn's input followed by its answer,
// with reasoning_content kept.
func (p *Plan) Conversation(answers []llm.Result) ([]Message, error) {
	if len(answers) > p.NumTurns() {
		return nil, fmt.Errorf("conversation: %d answers for a plan of %d turns", len(answers), p.NumTurns())
	}
	return p.build(answers, true, false)
}

// build interleaves the turn inputs with the answers; nextInput appends
// the input of the turn after the last answer.
func (p *Plan) build(answers []llm.Result, keepReasoning, nextInput bool) ([]Message, error) {
	msgs := make([]Message, 0, len(p.Messages)+3*len(answers)+1)
	msgs = append(msgs, p.Messages...)
	for j, res := range answers {
		a := Answer(j, res, keepReasoning)
		msgs = append(msgs, a)
		if j+1 >= p.NumTurns() || (j+1 == len(answers) && !nextInput) {
			continue
		}
		if ok, why := p.Continue(j, res); !ok {
			return nil, fmt.Errorf("turn %d cannot follow turn %d: %s", Ordinal(j+1), Ordinal(j), why)
		}
		msgs = append(msgs, link(p.Turns[j], res.ToolCalls, j)...)
	}
	return msgs, nil
}

// Answer turns a result into the assistant message that stands for it in
// the history and the export. Tool calls without an id get "call_<k>_<i>",
// so a tool result can name them.
func Answer(k int, res llm.Result, keepReasoning bool) Message {
	m := Message{Role: "assistant"}
	empty := res.Content == "" && (res.ContentJSON == nil || string(res.ContentJSON) == `""`)
	switch {
	case empty && len(res.ToolCalls) > 0:
		m.Content = json.RawMessage("null")
	case res.ContentJSON != nil:
		m.Content = res.ContentJSON // the bytes below, copied from the store's record
	default:
		// encoding/json's bytes, written faster: every earlier answer of
		// the history goes through here on every turn.
		m.Content = rawjson.AppendString(make([]byte, 0, len(res.Content)+len(res.Content)/16+2), res.Content)
	}
	if keepReasoning {
		m.ReasoningContent = res.ReasoningContent
	}
	if len(res.ToolCalls) > 0 {
		m.ToolCalls, _ = encode(callsWithIDs(k, res.ToolCalls))
	}
	return m
}

func callsWithIDs(k int, calls []llm.ToolCall) []llm.ToolCall {
	out := make([]llm.ToolCall, len(calls))
	for i, c := range calls {
		if c.ID == "" {
			c.ID = fmt.Sprintf("call_%d_%d", k, i)
		}
		if c.Type == "" {
			c.Type = "function"
		}
		out[i] = c
	}
	return out
}

// link returns t's input with its tool results pointed at the model's
// calls (answer k): a result naming a recorded call's id takes the id of
// the model's call at the same position; a result naming none takes the
// next call's id in order.
func link(t Turn, gen []llm.ToolCall, k int) []Message {
	if len(t.Calls) == 0 {
		return t.Input
	}
	ids := callsWithIDs(k, gen)
	byRecorded := make(map[string]string, len(t.Calls))
	for i, c := range t.Calls {
		if c.ID != "" && i < len(ids) {
			byRecorded[c.ID] = ids[i].ID
		}
	}
	out := make([]Message, len(t.Input))
	next := 0
	for i, m := range t.Input {
		if m.Role == "tool" {
			if id, ok := byRecorded[m.ToolCallID]; ok {
				m.ToolCallID = id
			} else if m.ToolCallID == "" && next < len(ids) {
				m.ToolCallID = ids[next].ID
			}
			next++
		}
		out[i] = m
	}
	return out
}

// Ordinal is the turn number people read for the 0-based turn index k:
// every message, reason, banner and view says "turn 1 of 3" for index 0.
// Stored and JSON turn fields stay 0-based indices (their documentation
// says so).
func Ordinal(k int) int { return k + 1 }

// Continue reports whether turn k+1 can follow res, the answer to turn k,
// and why not when it cannot. After the last turn it is false with no reason.
func (p *Plan) Continue(k int, res llm.Result) (bool, string) {
	if k+1 >= p.NumTurns() {
		return false, ""
	}
	next := p.Turns[k]
	gen := res.ToolCalls
	switch {
	case len(next.Calls) == 0 && len(gen) == 0:
		return true, ""
	case len(next.Calls) == 0:
		return false, fmt.Sprintf("turn %d called %s, but the dataset answered without a tool call and goes on with a %s message, so there is no tool result to send",
			Ordinal(k), describe(gen), next.Input[0].Role)
	case len(gen) == 0:
		return false, fmt.Sprintf("turn %d answered without a tool call where the dataset called %s, so the dataset's tool result answers nothing the model asked",
			Ordinal(k), describe(next.Calls))
	}
	if ok, why := MatchCalls(next.Calls, gen); !ok {
		return false, fmt.Sprintf("turn %d: the model's tool calls differ from the dataset's, so its recorded tool result does not answer them: %s", Ordinal(k), why)
	}
	return true, ""
}

// MatchCalls reports whether the model's calls match the recorded ones:
// as many calls, and position by position the same function name and
// arguments equal as JSON values.
func MatchCalls(recorded, gen []llm.ToolCall) (bool, string) {
	if len(recorded) != len(gen) {
		return false, fmt.Sprintf("the model made %d calls (%s), the dataset %d (%s)", len(gen), describe(gen), len(recorded), describe(recorded))
	}
	for i := range recorded {
		r, g := recorded[i].Function, gen[i].Function
		if r.Name != g.Name {
			return false, fmt.Sprintf("call %d is %s, the dataset's is %s", i, g.Name, r.Name)
		}
		rv, rerr := argsValue(r.Arguments)
		gv, gerr := argsValue(g.Arguments)
		switch {
		case gerr != nil:
			return false, fmt.Sprintf("call %d (%s): the model's arguments are not JSON: %v", i, g.Name, gerr)
		case rerr != nil:
			return false, fmt.Sprintf("call %d (%s): the dataset's arguments are not JSON: %v", i, r.Name, rerr)
		case !reflect.DeepEqual(rv, gv):
			return false, fmt.Sprintf("call %d (%s): arguments %s, the dataset's %s", i, g.Name, clip(g.Arguments, 160), clip(r.Arguments, 160))
		}
	}
	return true, ""
}

// argsValue parses tool-call arguments; a JSON string holding JSON (some
// datasets double-encode) is parsed once more.
func argsValue(s string) (any, error) {
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return nil, err
	}
	if inner, ok := v.(string); ok {
		var w any
		if json.Unmarshal([]byte(inner), &w) == nil {
			return w, nil
		}
	}
	return v, nil
}

func describe(calls []llm.ToolCall) string {
	names := make([]string, len(calls))
	for i, c := range calls {
		names[i] = c.Function.Name
	}
	return strings.Join(names, ", ")
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}

// encode writes v without HTML escaping: prompts are full of <, > and &.
func encode(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
