// Package capture captures the target model's hidden states for every done
// sample with token ids, exactly once: a stage of its own after generation.
//
// For each training row (a whole conversation, or each turn row with
// output.token_rows: turn; package tokenrows names and builds them, as
// export does) it sends the row's exact input ids to a capture server
// through Client (vLLM's extract_hidden_states contract first, vllm.go),
// checks the prompt ids the server answers with against them, waits for
// the server's write to end, checks the file (CheckFile: header, dtype,
// shape, token ids, no NaN/Inf), moves it into the dataset's folder under
// a name derived from the row's key alone (move: never replacing a file,
// durable before it is recorded), and records its path, bytes, sha256 and
// shape in the store (store.Captures). Large data never enters the store.
//
// Exactly once. A key is claimed under a fenced lease before anything is
// sent; its file is recorded in the same store transaction that marks it
// captured. A kill between placing a file and recording it leaves the file
// under its stable name: the next claim of the key checks that file and
// records it (it is never captured twice, nor listed without a check).
// Placing never replaces an existing file, so a worker that lost its lease
// cannot overwrite a file another worker recorded. Temporary copies (a
// move across file systems) are named .capture-*.part and swept at start.
//
// Faults follow generation's rules: a server that is unreachable, answers
// 5xx or names no file spends no attempt (the endpoint backs off; every
// endpoint down for Config.DownAfter stops the run); a bad file or answer
// of the key's own (a *FileError: nan, inf, token_ids, shape, dtype,
// header, truncated, missing, prompt_ids, request, slow) spends one, and
// Config.MaxAttempts of them make the key dead with the last evidence.
//
// The package never decides what a training row is (tokenrows), never
// prints, and never imports the runner.
package capture
