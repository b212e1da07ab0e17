package llm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/regen-dev/regen/internal/rawjson"
)

// Defaults for the zero values of Config.
const (
	DefaultMaxConns       = 64
	DefaultRequestTimeout = 30 * time.Minute
	DefaultIdleTimeout    = 60 * time.Second
)

// A connection's buffer sizes (net/http's default is 4 KB each).
const (
	connWriteBuffer = 1 << 10
	connReadBuffer  = 2 << 10
)

// errBodyLimit caps how much of an error response is read into Error.Msg.
const errBodyLimit = 4 << 10

// Config configures a Client for one endpoint.
type Config struct {
	// BaseURL is the server root, with or without a trailing /v1
	// (http://127.0.0.1:30000 and http://127.0.0.1:30000/v1 are the same).
	BaseURL string
	// APIKey is sent as "Authorization: Bearer <key>" when not empty.
	APIKey string
	// MaxConns is the number of connections kept open for reuse; set it to
	// at least the endpoint's concurrency so streams never churn sockets.
	// 0 means DefaultMaxConns.
	MaxConns int
	// RequestTimeout bounds a whole request, stream included. 0 means
	// DefaultRequestTimeout.
	RequestTimeout time.Duration
	// IdleTimeout bounds silence: the wait for response headers, and any gap
	// between bytes once the body has started. 0 means DefaultIdleTimeout.
	IdleTimeout time.Duration
	// HeaderTimeout bounds the wait for response headers. Engines send them
	// at once, a queued request included, so a server silent this long
	// accepts connections without answering: the error says so and is an
	// EndpointFault. 0 means IdleTimeout.
	HeaderTimeout time.Duration
	// ProgressTimeout bounds how long a stream may go on sending bytes that
	// carry no token (keep-alive comments, empty chunks): past it the stream
	// is cut with ErrNoProgress. 0 means IdleTimeout.
	ProgressTimeout time.Duration
	// FirstByteTimeout bounds the wait between the response headers and the
	// first body byte. A request queued on a busy server sends nothing until
	// its first token, which can take minutes, so 0 (the default) leaves
	// that wait bounded by RequestTimeout only.
	FirstByteTimeout time.Duration
	// TokenIDFields are request fields, each sent as true, that ask the
	// server for the prompt and completion token ids in its own dialect
	// (vLLM's return_token_ids, SGLang's return_input_ids_in_sglext and
	// return_output_ids_in_sglext: docs/engines.md §10). Empty asks for none,
	// so a server that rejects unknown fields never sees them.
	TokenIDFields []string
}

// Client talks to one OpenAI-compatible endpoint. It is safe for
// concurrent use and never retries on its own.
type Client struct {
	cfg      Config
	chatURL  string
	modelURL string
	urlErr   error
	tr       *http.Transport
	hc       *http.Client
	// fresh never reuses a connection: the one replay of a request whose
	// reused connection the server closed before answering goes there.
	fresh   *http.Client
	replays atomic.Int64
}

// New returns a Client with its own connection pool. An unusable BaseURL
// is reported by every call as a ServerDown error.
func New(cfg Config) *Client {
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.HeaderTimeout <= 0 {
		cfg.HeaderTimeout = cfg.IdleTimeout
	}
	if cfg.ProgressTimeout <= 0 {
		cfg.ProgressTimeout = cfg.IdleTimeout
	}
	c := &Client{cfg: cfg}
	base, err := normalizeBase(cfg.BaseURL)
	if err != nil {
		c.urlErr = err
	}
	c.chatURL = base + "/v1/chat/completions"
	c.modelURL = base + "/v1/models"
	dialer := &net.Dialer{Timeout: cfg.IdleTimeout, KeepAlive: 30 * time.Second}
	c.tr = &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         bodyDialer(dialer.DialContext),
		MaxIdleConns:        cfg.MaxConns,
		MaxIdleConnsPerHost: cfg.MaxConns,
		IdleConnTimeout:     90 * time.Second,
		// An SSE stream must arrive as the server flushes it.
		DisableCompression: true,
		// Every open stream holds its connection's buffers (4 KB each by
		// default) for minutes, 10,000 of them on a big worker. Requests
		// are written through the write buffer only up to their headers (a
		// large body goes to the socket directly), and SSE lines are a few
		// hundred bytes.
		WriteBufferSize: connWriteBuffer,
		ReadBufferSize:  connReadBuffer,
	}
	// No Client.Timeout: it would cut long streams; the watchdog in Chat
	// bounds silence instead.
	c.hc = &http.Client{Transport: c.tr}
	fresh := c.tr.Clone()
	fresh.DisableKeepAlives = true
	c.fresh = &http.Client{Transport: fresh}
	return c
}

func normalizeBase(raw string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return "", fmt.Errorf("base url %q: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return "", fmt.Errorf("base url %q: want http(s)://host[:port]", raw)
	}
	p := strings.TrimRight(u.Path, "/")
	p = strings.TrimSuffix(p, "/v1")
	u.Path = p
	u.RawQuery, u.Fragment = "", ""
	return strings.TrimRight(u.String(), "/"), nil
}

// Close drops idle connections. In-flight calls are not affected.
func (c *Client) Close() {
	c.tr.CloseIdleConnections()
	c.fresh.CloseIdleConnections()
}

// Replays is how many times a request went out again on another
// connection because the server had closed the reused one it was sent on
// before answering (a keep-alive race: llama-server closes every
// connection after a streamed answer while its headers say Keep-Alive).
// Replays never surface as errors; the count is for the caller's log.
func (c *Client) Replays() int64 { return c.replays.Load() }

// Sentinel causes for the request context, so a cancelled read can be told
// apart from the caller giving up.
var (
	errIdle           = errors.New("stream idle")
	errHeaders        = errors.New("no response headers")
	errFirstByte      = errors.New("no first byte")
	errRequestTimeout = errors.New("request timeout")
)

// Watchdog phases.
const (
	phaseHeaders int32 = iota
	phaseFirstByte
	phaseStreaming
)

// watchdog cancels the request when the connection stays silent for longer
// than the current phase allows.
type watchdog struct {
	t       *time.Timer
	cancel  context.CancelCauseFunc
	phase   atomic.Int32
	headers time.Duration
	idle    time.Duration
	firstBy time.Duration
}

func newWatchdog(cancel context.CancelCauseFunc, headers, idle, firstByte time.Duration) *watchdog {
	w := &watchdog{cancel: cancel, headers: headers, idle: idle, firstBy: firstByte}
	w.t = time.AfterFunc(headers, w.fire)
	return w
}

func (w *watchdog) fire() {
	switch w.phase.Load() {
	case phaseHeaders:
		w.cancel(errHeaders)
	case phaseFirstByte:
		w.cancel(errFirstByte)
	default:
		w.cancel(errIdle)
	}
}

// headersIn moves to waiting for the first body byte.
func (w *watchdog) headersIn() {
	w.phase.Store(phaseFirstByte)
	if w.firstBy > 0 {
		w.t.Reset(w.firstBy)
	} else {
		w.t.Stop()
	}
}

func (w *watchdog) stop() { w.t.Stop() }

// watchedBody resets the watchdog whenever bytes arrive.
type watchedBody struct {
	r io.Reader
	w *watchdog
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if n > 0 {
		if b.w.phase.Load() != phaseStreaming {
			b.w.phase.Store(phaseStreaming)
		}
		b.w.t.Reset(b.w.idle)
	}
	return n, err
}

// call holds one request's contexts so errors can be classified.
type call struct {
	parent  context.Context
	ctx     context.Context
	done    func()
	wd      *watchdog
	timeout time.Duration
	// deltas and lastDelta are the stream's progress, kept by readStream
	// (the goroutine that calls fail), to tell a generation longer than
	// RequestTimeout from a server that stopped generating.
	deltas    int
	lastDelta time.Time
	// progress bounds the bytes without a token (Config.ProgressTimeout).
	progress time.Duration
}

func (c *Client) start(parent context.Context) *call {
	tctx, tcancel := context.WithTimeoutCause(parent, c.cfg.RequestTimeout, errRequestTimeout)
	ctx, cancel := context.WithCancelCause(tctx)
	wd := newWatchdog(cancel, c.cfg.HeaderTimeout, c.cfg.IdleTimeout, c.cfg.FirstByteTimeout)
	return &call{parent: parent, ctx: ctx, wd: wd, timeout: c.cfg.RequestTimeout, progress: c.cfg.ProgressTimeout, done: func() {
		wd.stop()
		cancel(nil)
		tcancel()
	}}
}

// fail turns a transport or read error into the error Chat returns: the
// caller's own cancellation passes through unclassified, a request timeout
// with tokens still flowing is the sample's own (too long a generation),
// everything else on the wire means the server is unreachable, dying or hung.
func (k *call) fail(what string, err error) error {
	if perr := k.parent.Err(); perr != nil {
		return fmt.Errorf("%s: %w", what, perr)
	}
	cause := context.Cause(k.ctx)
	switch {
	case errors.Is(cause, errIdle):
		return &Error{Class: ServerDown, Msg: what + ": stream idle for " + k.wd.idle.String()}
	case errors.Is(cause, errHeaders):
		return &Error{Class: ServerDown, EndpointFault: true,
			Msg: what + ": no response headers within " + k.wd.headers.String() + ": the server accepts connections but does not answer (generation.header_timeout)"}
	case errors.Is(cause, errFirstByte):
		return &Error{Class: ServerDown, Msg: what + ": no first byte within " + k.wd.firstBy.String()}
	case errors.Is(cause, errRequestTimeout):
		// Tokens were arriving until the deadline: the server works and this
		// generation is longer than the timeout allows. Releasing it without
		// spending an attempt would loop it forever and trip the endpoint's
		// breaker each time, so it spends one and dead-letters in the end.
		// Before the first token, or after a silence, the server is the suspect.
		if k.deltas > 0 && time.Since(k.lastDelta) < k.wd.idle {
			return &Error{Class: Retryable, Msg: fmt.Sprintf("%s: request timeout %v exceeded while streaming (%d chunks received); raise generation.request_timeout", what, k.timeout, k.deltas), Err: err}
		}
		return &Error{Class: ServerDown, Msg: what + ": request timeout " + k.timeout.String(), Err: err}
	}
	return &Error{Class: ServerDown, Msg: what, Err: err}
}

// connTrace records, for one request, whether the connection it last went
// out on was a reused one and whether any byte of an answer came back.
type connTrace struct {
	conns    atomic.Int32
	reused   atomic.Bool
	answered atomic.Bool
}

func (t *connTrace) hooks() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			t.conns.Add(1)
			t.reused.Store(info.Reused)
		},
		GotFirstResponseByte: func() { t.answered.Store(true) },
	}
}

// send does req on a pooled connection. A server may close an idle
// keep-alive connection just as a request goes out on it; the request then
// fails before any byte of an answer, which says nothing about the server.
// Two layers make sure such a request is sent again instead of surfacing
// as an outage:
//
//   - The transport replays a request that failed on a reused connection
//     when it can rewind the body (GetBody, which NewRequestWithContext
//     sets for a bytes.Reader) and either nothing was written or the
//     request is replayable, which for a POST means an Idempotency-Key
//     header; a key with no value counts and is not sent (net/http,
//     transport.go: the Transport doc comment, persistConn.shouldRetryRequest;
//     request.go: Request.isReplayable). Replaying a chat request is safe:
//     the server closed the connection without answering it.
//   - Anything the transport does not replay (a write half done when the
//     connection broke, "transport connection broken") is sent once more
//     here on a fresh connection, when the last connection used was a
//     reused one and no answer byte came back. A failure on a fresh
//     connection is the server's and is returned.
func (c *Client) send(k *call, req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodPost {
		req.Header["Idempotency-Key"] = nil
	}
	var tr connTrace
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), tr.hooks()))
	resp, err := c.hc.Do(req)
	if n := tr.conns.Load(); n > 1 {
		c.replays.Add(int64(n - 1))
	}
	if err == nil || !tr.reused.Load() || tr.answered.Load() || k.ctx.Err() != nil {
		return resp, err
	}
	again := req.Clone(req.Context())
	if req.GetBody != nil {
		body, berr := req.GetBody()
		if berr != nil {
			return nil, err
		}
		again.Body = body
	}
	c.replays.Add(1)
	k.wd.t.Reset(k.wd.headers) // a new wait for headers
	return c.fresh.Do(again)
}

// do sends req and returns a 200 response with its body watched, or a
// classified error (the body of an error response is read and closed).
func (c *Client) do(k *call, req *http.Request, what string) (*http.Response, error) {
	if c.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.cfg.APIKey)
	}
	resp, err := c.send(k, req)
	if err != nil {
		return nil, k.fail(what, err)
	}
	k.wd.headersIn()
	resp.Body = struct {
		io.Reader
		io.Closer
	}{&watchedBody{r: resp.Body, w: k.wd}, resp.Body}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		b, rerr := io.ReadAll(io.LimitReader(resp.Body, errBodyLimit))
		if rerr != nil && k.parent.Err() != nil {
			return nil, k.fail(what, rerr)
		}
		// A body cut short still names the status, which is what counts.
		e := parseErrorBody(b)
		wait, ok := retryAfter(resp.Header, time.Now())
		return nil, &Error{Class: classifyStatus(resp.StatusCode, ok, e), Status: resp.StatusCode, Msg: e.Msg, RetryAfter: wait}
	}
	return resp, nil
}

// Chat sends one streaming chat completion and assembles the result.
// onDelta, when not nil, is called with 1 for every chunk that carries
// content, reasoning or a tool-call delta, as evidence of progress. Errors
// are *Error values except the caller's own cancellation, which is returned
// wrapped so that errors.Is(err, context.Canceled) (or DeadlineExceeded)
// holds.
func (c *Client) Chat(ctx context.Context, req Request, onDelta func(tokens int)) (Result, error) {
	const what = "chat"
	if c.urlErr != nil {
		return Result{}, &Error{Class: ServerDown, Msg: what, Err: c.urlErr}
	}
	body, err := buildParts(req, c.cfg.TokenIDFields)
	if err != nil {
		return Result{}, err
	}
	start := time.Now()
	k := c.start(ctx)
	defer k.done()
	hreq, err := http.NewRequestWithContext(k.ctx, http.MethodPost, c.chatURL, body.reader())
	if err != nil {
		return Result{}, &Error{Class: ServerDown, Msg: what, Err: err}
	}
	// Set as NewRequest sets them for a bytes.Reader, so the transport
	// can rewind the body (send) and states its length.
	hreq.ContentLength = body.size()
	hreq.GetBody = func() (io.ReadCloser, error) { return body.reader(), nil }
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	if req.RoutingKey != "" {
		hreq.Header.Set("X-SMG-Routing-Key", req.RoutingKey)
	}
	resp, err := c.do(k, hreq, what)
	if err != nil {
		return Result{}, err
	}
	defer resp.Body.Close()
	switch media := mediaType(resp.Header); media {
	case "application/json":
		return Result{}, jsonInsteadOfStream(k, resp.Body)
	case "", "text/event-stream":
	default:
		return Result{}, notAStream(k, media, resp.Body)
	}
	res, err := readStream(k, resp.Body, start, newBudget(req.MaxTokens), onDelta)
	if k.emptyBody(err) {
		err = emptyAnswer(resp.Header)
	}
	if err != nil {
		return Result{}, err
	}
	res.Duration = time.Since(start)
	return res, nil
}

// jsonInsteadOfStream handles a 200 answer with a JSON body, which servers
// send for some errors even when asked to stream.
func jsonInsteadOfStream(k *call, body io.Reader) error {
	b, err := io.ReadAll(io.LimitReader(body, errBodyLimit))
	if err != nil && len(b) == 0 {
		return k.fail("chat", err)
	}
	var probe struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(b, &probe) == nil && len(probe.Error) > 0 && string(probe.Error) != "null" {
		e := parseErrorBody(b)
		return &Error{Class: classifyEvent(e), Status: e.Code, Msg: e.Msg}
	}
	return &Error{Class: Malformed, EndpointFault: true,
		Msg: `chat: answered 200 with a JSON body instead of an event stream ("stream": true ignored): is this an OpenAI-compatible endpoint? ` + clip(b, 200)}
}

// Models lists the model ids the endpoint serves (GET /v1/models), under
// the same timeouts and error classes as Chat.
func (c *Client) Models(ctx context.Context) ([]string, error) {
	const what = "models"
	if c.urlErr != nil {
		return nil, &Error{Class: ServerDown, Msg: what, Err: c.urlErr}
	}
	k := c.start(ctx)
	defer k.done()
	hreq, err := http.NewRequestWithContext(k.ctx, http.MethodGet, c.modelURL, nil)
	if err != nil {
		return nil, &Error{Class: ServerDown, Msg: what, Err: err}
	}
	resp, err := c.do(k, hreq, what)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, k.fail(what, err)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, &Error{Class: Malformed, Msg: what + ": " + clip(b, 200), Err: err}
	}
	ids := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	return ids, nil
}

// buildBody merges Body's keys, then Params (which win), then the keys the
// client owns (tokenIDs among them). Keys come out sorted, values compact
// and HTML characters unescaped, so the bytes are deterministic and
// prompts are sent as written: the bytes encoding/json writes for the
// merged map of raw values. Body is walked, not decoded (package rawjson):
// it holds a conversation's whole history, and decoding and re-encoding it
// cost several times what sending it does, on every turn.
func buildBody(req Request, tokenIDs []string) ([]byte, error) {
	parts, err := buildParts(req, tokenIDs)
	if err != nil {
		return nil, err
	}
	return bytes.Join(parts, nil), nil
}

// bigValue is the size from which buildParts leaves a value where it is.
const bigValue = 1 << 10

// bodyParts are a request body's bytes in pieces, as buildParts makes them.
type bodyParts [][]byte

// buildParts is buildBody's bytes in pieces: a value of bigValue bytes or
// more (the messages of a long history) is Body's own slice, not a copy, so
// an open stream holds its history once (the caller's) instead of twice.
func buildParts(req Request, tokenIDs []string) (bodyParts, error) {
	obj, pieces, size, err := mergedBody(req, tokenIDs)
	if err != nil {
		return nil, err
	}
	var parts bodyParts
	out := make([]byte, 0, min(size, 4<<10)+len(req.Model)+128+32*len(tokenIDs)+32*len(req.TokenIDFields))
	out = append(out, '{')
	for i, k := range slices.Sorted(maps.Keys(obj)) {
		if i > 0 {
			out = append(out, ',')
		}
		out = appendKey(out, k)
		out = append(out, ':')
		vs := [][]byte{obj[k]}
		if obj[k] == nil {
			vs = pieces[k]
		}
		for _, v := range vs {
			if len(v) >= bigValue {
				// out keeps growing past the piece handed over, never into it.
				parts = append(parts, out, v)
				out = out[len(out):]
				continue
			}
			out = append(out, v...)
		}
	}
	return append(parts, append(out, '}')), nil
}

// mergedBody is the map of raw values buildParts writes, the values of
// members given in pieces (nil in obj), and about how many bytes they take.
func mergedBody(req Request, tokenIDs []string) (obj map[string]json.RawMessage, pieces map[string][][]byte, size int, err error) {
	obj = make(map[string]json.RawMessage, 8+len(req.Params))
	size = len(req.Body)
	if req.Members != nil {
		size = 0
		for _, m := range req.Members {
			obj[m.Key] = m.Value
			size += len(m.Key) + len(m.Value) + 4
			if m.Value == nil && m.Pieces != nil {
				if pieces == nil {
					pieces = map[string][][]byte{}
				}
				pieces[m.Key] = m.Pieces
				for _, p := range m.Pieces {
					size += len(p)
				}
			}
		}
	} else if len(bytes.TrimSpace(req.Body)) > 0 {
		err := rawjson.Object(req.Body, func(m rawjson.Member) error {
			obj[m.Key] = m.Value
			if m.Spaced {
				obj[m.Key] = compact(m.Value)
			}
			return nil
		})
		if err != nil {
			return nil, nil, 0, &Error{Class: BadRequest, Msg: "chat: request body is not a JSON object", Err: err}
		}
	}
	for k, v := range req.Params {
		if !json.Valid(v) {
			return nil, nil, 0, &Error{Class: BadRequest, Msg: fmt.Sprintf("chat: param %q is not valid JSON", k)}
		}
		obj[k] = compact(v)
		size += len(k) + len(v) + 4
	}
	if req.Model != "" {
		m, _ := json.Marshal(req.Model)
		obj["model"] = m
	}
	if req.MaxTokens > 0 {
		obj["max_tokens"] = json.RawMessage(fmt.Sprint(req.MaxTokens))
	}
	for _, f := range tokenIDs {
		obj[f] = json.RawMessage("true")
	}
	for _, f := range req.TokenIDFields {
		obj[f] = json.RawMessage("true")
	}
	if req.Priority != nil {
		obj["priority"] = json.RawMessage(fmt.Sprint(*req.Priority))
	}
	obj["stream"] = json.RawMessage("true")
	obj["stream_options"] = json.RawMessage(`{"include_usage":true}`)
	return obj, pieces, size, nil
}

// size is the body's length in bytes.
func (p bodyParts) size() int64 {
	var n int64
	for _, b := range p {
		n += int64(len(b))
	}
	return n
}

// reader reads the body from its start; each call gives a new one, for
// the transport's rewind (GetBody) and the replay on a fresh connection.
func (p bodyParts) reader() io.ReadCloser {
	// Read consumes the slice, not the bytes.
	return &partsReader{bufs: net.Buffers(slices.Clone(p)), left: p.size()}
}

// compact is v as encoding/json writes a raw value: without insignificant
// whitespace (v is valid JSON).
func compact(v []byte) json.RawMessage {
	var b bytes.Buffer
	if json.Compact(&b, v) != nil {
		return v
	}
	return b.Bytes()
}

// appendKey appends k as encoding/json writes a map key without HTML
// escaping.
func appendKey(out []byte, k string) []byte {
	if !strings.ContainsFunc(k, func(r rune) bool { return r < 0x20 || r == '"' || r == '\\' || r >= 0x7f }) {
		out = append(out, '"')
		out = append(out, k...)
		return append(out, '"')
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(k) // a string always encodes
	return append(out, bytes.TrimSuffix(b.Bytes(), []byte("\n"))...)
}

// readerPool recycles the per-stream line buffers.
var readerPool = sync.Pool{New: func() any { return newLineReader() }}

func clip(b []byte, n int) string {
	b = bytes.TrimSpace(b)
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}
