// Package llm is regen's client for OpenAI-compatible chat servers (SGLang,
// vLLM, llama-server, the simulator). It owns one thing: turning a Request
// into one streamed POST /v1/chat/completions and the stream into a Result,
// or into an *Error whose Class tells the dispatcher what to do. It never
// sleeps, logs or keeps state between calls, and retries only what never
// reached the server (below); retry policy, circuit breaking and attempt
// accounting live in the dispatcher.
//
// # Requests
//
// New(Config) builds a Client with its own http.Transport (MaxIdleConnsPerHost
// equal to Config.MaxConns, no compression, no client-wide timeout, which
// would cut long streams). Chat sends Body's keys, then Params (which win),
// then model (when set), max_tokens (when > 0), stream=true and
// stream_options.include_usage=true, which the client owns. Keys go
// out sorted and without HTML escaping, so the bytes are deterministic and
// engine extras such as chat_template_kwargs pass through untouched. Models
// lists GET /v1/models under the same timeouts.
//
// # Streams
//
// The SSE body is read line by line (bufio.Reader.ReadSlice); comments,
// blank lines and non-data fields are skipped, "data: [DONE]" ends the
// stream, and every other data line is decoded by one json.Decoder reused
// for the whole stream into one reused struct. Content, reasoning_content
// (or vLLM's reasoning), and tool_calls deltas (by index: id, name,
// arguments concatenated) of choice 0 are assembled; finish_reason, model
// and usage (cached_tokens from prompt_tokens_details, reasoning_tokens
// from usage or completion_tokens_details) are kept. onDelta(1) is called,
// synchronously, for each chunk that carries a delta, as progress evidence.
// TTFT is the time to the first such chunk; Duration is the whole call.
// After [DONE] the rest of the body is drained so the connection is reused.
//
// # Budget
//
// A server that ignores max_tokens could stream for ever and grow the
// runner without bound. A stream is cut once it sends more chunks with a
// delta than max_tokens plus half again (at least 256 more), or keeps more
// than 1 MiB + 64 bytes per max_tokens token of answer (text, reasoning,
// tool calls, 4 bytes per token id; 32 MiB without max_tokens). The error
// is Retryable and names the budget: the answer's fault, an attempt spent.
//
// Every byte counts: the lines that carry no token (SSE comments such as
// ": keepalive", other fields, blank lines, data chunks with nothing in
// them) count against the same byte budget beside the answer, and such
// lines for ProgressTimeout (default IdleTimeout) with no token end the
// stream as silence would. That error is ServerDown wrapping ErrNoProgress:
// whether one stream or the whole server makes no progress is the
// dispatcher's judgement.
//
// # Keep-alive races
//
// A server may close an idle keep-alive connection just as a request goes
// out on it (llama-server closes every connection after a streamed answer
// while its headers say Keep-Alive). Such a request fails before any byte
// of an answer and says nothing about the server, so it is sent again at
// once: each POST carries an Idempotency-Key with no value (not sent on the
// wire) so net/http's transport replays it, and what the transport does not
// replay is sent once more on a fresh connection when it failed on a reused
// one with no answer byte. A failure on a fresh connection is returned.
// Client.Replays counts these replays for the caller's log.
//
// # Token ids
//
// With Config.TokenIDFields set, each named field is sent as true (the
// engine's own way of asking for token ids; docs/engines.md §10) and the
// ids are read from either shape an engine streams them in: vLLM's
// top-level prompt_token_ids in the first chunk plus token_ids on every
// choice chunk (appended in order, including chunks with no text), or
// SGLang's response-level sglext chunk (input_ids, and output_ids with one
// list per choice). They land in Result.PromptTokenIDs and
// CompletionTokenIDs exactly as sent; the client never makes ids from text.
//
// # Timeouts
//
// RequestTimeout (default 30m) bounds the whole call. IdleTimeout (default
// 60s) bounds the wait for response headers and any silence once the body
// has started. The gap between headers and the first body byte is bounded
// by FirstByteTimeout only when set, because a request queued on a busy
// engine legitimately sends nothing for minutes. When RequestTimeout ends a
// stream whose tokens were still arriving (at least one delta, the last one
// less than IdleTimeout ago), the generation is simply longer than the
// timeout: that error is Retryable, so it spends an attempt and the sample
// dead-letters in the end with a message naming generation.request_timeout,
// instead of being released forever while tripping the endpoint's breaker.
// Before the first delta, or after a silence, the timeout is ServerDown.
//
// # Error classes
//
// The HTTP status decides first, then the error object's structured type
// ("type", or a non-numeric "code": llama-server's
// exceed_context_size_error, vLLM's BadRequestError, OpenAI's
// context_length_exceeded); words in the message only refine a 4xx (does it
// name the context length?) and mark a dead engine behind a 5xx or a
// code-less event. A message never makes a server error a bad request: an
// in-band {"message":"KV cache usage exceeds the pool","code":500} is
// Retryable.
//
//   - ServerDown: any transport failure (connection refused or reset, EOF
//     before headers, a body cut before finish_reason), any of the timeouts
//     above (except a request timeout while tokens flow), HTTP 502/503/504
//     (503 only without Retry-After), 401/403 and 404 (a key, model name or
//     path the server does not know is the endpoint's problem, so pause it
//     rather than dead-letter every sample: a wrong model name on vLLM
//     answers 404 to all), an unusable BaseURL, and an HTTP 5xx or a
//     mid-stream error event (code 5xx or none) whose message says the
//     engine is dead (vLLM's EngineDeadError, "EngineCore encountered ...",
//     "Engine loop is not running", SGLang's "Scheduler hit an exception" or
//     SIGQUIT texts): a dead engine's front end answers 500 for seconds
//     before it exits, and that outage must not spend an attempt on every
//     sample in flight or claimed meanwhile.
//   - Backpressure: HTTP 429, 503 with a Retry-After, a mid-stream error
//     event with code 429, or a code-less one typed as a rate limit. The
//     server is alive and asks for less; Error.RetryAfter holds its
//     Retry-After (delta-seconds or an HTTP-date, RFC 9110 §10.2.3, taken
//     relative to the response's Date; 0 when absent or unreadable).
//   - Retryable: HTTP 408, 500 and other 5xx (the engine answered), a 4xx
//     not listed under BadRequest, a mid-stream {"error":...} event with a
//     5xx code, or with no code and no request-error type, finish_reason
//     "abort", a stream past its budget, and RequestTimeout reached while
//     tokens were still arriving.
//   - BadRequest: HTTP 400, 413, 422, any other 4xx (but 401/403/404/408/
//     429) whose type is a request error or whose message names the context
//     length, a mid-stream error event with a 4xx code (but 408/429) or,
//     without a code, a request-error type, and a Request whose Body or
//     Params are not valid JSON (checked before sending).
//   - Malformed: a data line that is not one JSON value, [DONE] without a
//     finish_reason, a 200 JSON body that is not an error, or a line over
//     16 MiB.
//
// Error.InStream marks an error sent as an event inside a 200 stream.
//
// A stream that ends (cleanly or not) after finish_reason but without
// [DONE] is accepted. Error bodies are read up to 4 KiB and the server's
// message goes into Error.Msg. When the caller's ctx ends, Chat returns
// ctx.Err() wrapped (errors.Is(err, context.Canceled) holds) and no *Error:
// the caller decides what a cancellation means.
//
// # Why hand-written, measured
//
// BenchmarkStream (bench_test.go) streams 500 SGLang-shaped content chunks,
// a finish chunk, a usage chunk and [DONE] from an httptest server on
// 127.0.0.1, flushing every event, and reads the whole stream. "floor" is
// net/http reading the body with no parsing (the cost every client pays;
// it includes the server). Run on the shared 2-core dev box with
//
//	go test -run '^$' -bench BenchmarkStream -benchtime 50x -count 3 ./internal/llm
//
//	                       ns/op (500 chunks)   B/op       allocs/op   CPU per chunk
//	floor                  1.17–1.83 ms          11.4 KB      585        2.2–3.0 µs
//	this client            3.65–4.49 ms          32.2 KB    1,169        7.4–8.8 µs
//	openai-go v3.98.0      13.3–19.4 ms          4.53 MB   30,852       28.9–37.2 µs
//
// Above the floor this client costs about 1.2 allocations, 40 bytes and
// 5 µs of CPU per chunk; openai-go (option.WithMaxRetries(0),
// Chat.Completions.NewStreaming, reasoning_content read through
// JSON.ExtraFields) costs about 60 allocations, 9 KB and 27–34 µs. At 512
// streams of 50 tokens/s (25k chunks/s) that is about 0.2 core against 0.8
// core on a 2-core worker. Reusing one json.Decoder per stream instead of
// json.Unmarshal per chunk took this client from 5,171 to 1,169 allocs/op
// and from 213 KB to 32 KB per stream. Memory per open stream is mostly
// buffers held for the stream's whole life: a 2 KB line buffer and the
// connection's 1 KB write and 2 KB read buffers (16, 4 and 4 KB before);
// at 10,000 streams (go run ./bench -only streams) the runner's RSS per
// stream went from 54.6 to 44.6 KiB on the plateau and from 74.0 to 57.9
// KiB at its peak (medians of 3), with no change in CPU per chunk. The connection trace that the
// keep-alive replay needs adds about 10 allocations per request, not per
// chunk (1,176-1,185 allocs/op). The request body is sent in pieces that
// leave a long value (a conversation's messages) in the caller's slice, so
// an open stream holds its history once: BenchmarkChatLongBody, a 65.7 KB
// body, allocates 70.6 KB per request instead of 139.6 KB; written with one
// writev from those pieces (bodyConn) instead of through net.TCPConn's new
// 32 KB copy buffer, 37.6 KB. A member may come in pieces itself
// (Member.Pieces: a conversation's history as its turns added it), sent as
// they are. Beyond speed, openai-go retries 5xx
// and connection errors on its own by default (which would hide outages
// from the dispatcher's accounting), adds X-Stainless headers, and pulls
// cloud SDKs into the module graph; so it stays in _test files only, as an
// independent client in the benchmark.
package llm
