// Package sim is regen's simulated inference server: an OpenAI-compatible
// HTTP server that behaves like SGLang (or, with Engine "vllm", like vLLM)
// wherever regen's decisions depend on it, so every promise regen makes can
// be tested without a GPU.
//
// One scheduler goroutine owns a KV token pool of Config.KVTokens tokens
// and runs continuous batching: a waiting request is admitted when its
// prompt plus a reserved share of its max_tokens (SGLang's new-token ratio,
// decaying per decode step) fits beside the running ones, up to the
// running-request cap. Prompts are cut at message boundaries into a prefix
// tree standing in for SGLang's radix cache (prefix.go): a prefix's KV is
// held in the pool once for every request sharing it, locked while one
// runs and kept after, evicted least recently used (leaves first) only
// when the pool needs the room; cached prefixes count as free in the
// reported usage, as SGLang's num_used does. A prefill batch costs time in
// proportion to its uncached prompt tokens only, and each request reports
// its hit as usage.prompt_tokens_details.cached_tokens and in the engine's
// counters (SGLang cached_tokens_total and cache_hit_rate, vLLM
// prefix_cache_queries_total and prefix_cache_hits_total); a decode step costs DecodeBase plus a share per
// running request and per thousand tokens in use, so throughput rises with
// batch size and saturates. The step times come from a named profile
// (profile.go): calibrated, the default, fitted to published 8 x H200
// measurements (docs/engines.md §15), or fast, the cheap prefill tests use.
// When the pool cannot hold the next step the
// newest requests are retracted: their KV and decode progress are lost,
// they return to the head of the queue and are re-prefilled and re-decoded
// later (tokens already streamed are not sent twice), so over-admission
// lowers goodput as it does on a real server.
//
// All durations in Config are simulated time. The scheduler sleeps until
// the real deadline of each step scaled by Speed, so Speed changes how
// fast the server runs but not what it decides; idle gaps and CPU lag are
// not replayed.
//
// The HTTP surface is SGLang's: /v1/chat/completions and /v1/completions
// (streaming chunks shaped like SGLang's, reasoning_content when the request
// asks for thinking, tool-call deltas when it has tools, usage with
// include_usage), /v1/models, /health and /health_generate (a real 1-token
// probe with SGLang's timeout), /get_server_info and /server_info, and
// /metrics with SGLang's names and labels, gauges updated at prefill
// batches and every DecodeLogInterval decode steps. Log lines go to the
// writer given to New in SGLang's (or vLLM's) formats, because they are the
// contract regen's log watcher parses.
//
// A chat request that asks for token ids the vLLM way (return_token_ids:
// prompt_token_ids in the first chunk, token_ids on every chunk) or the
// SGLang way (return_input_ids_in_sglext, return_output_ids_in_sglext: one
// sglext chunk before [DONE]) gets them from a small deterministic
// tokenizer (tokens.go): an append-only chat template in which each
// generated word is one id, so an answer sent back in the history is the
// same ids at the same place; its prompt_tokens is then the rendered ids'
// count. Config.ChatTemplate drop-reasoning renders earlier assistant turns
// without their reasoning instead (Kimi-K2.5's template does so), so a
// thinking answer is not in the next prompt as it was generated. Requests that do not ask keep the byte estimate.
//
// Faults (Fault, from Config shortcuts, Config.Faults or a YAML scenario)
// crash the server with an exit code and the engine's crash text, hang or
// kill generation while HTTP stays up, slow steps down, or answer requests
// with an error status (5xx, or 4xx with a message, as a server refusing a
// generation parameter does), a TCP reset or a malformed chunk; a cut fault
// cuts the stream of every request whose last user message holds a given
// text (no finish_reason, no [DONE]) while answering every other prompt,
// and a throttle answers 429 (or 503) with a Retry-After for a window of
// time or a share of requests (that window is measured on the wall clock
// scaled by Speed, since the scheduler's clock stands still while a
// throttled server idles; the Retry-After is sent as configured, not
// scaled); a broken fault answers every generation request with a 500 (or
// another status) from its trigger, for a while or for ever, while /health
// stays healthy: a server broken in the middle of a job. A crash closes the listener
// and every connection and delivers the exit code on Crashed; the package
// never exits the process itself. Output lengths, content and faults are
// deterministic for a given Seed and request content (including the
// request's own seed parameter, which varies the answer to one prompt).
package sim
