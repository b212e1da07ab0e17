// Package export turns the finished samples of a store into dataset files.
//
// Export reads the store's Finished once, in sample-id order, and streams
// every row to the writers of the requested formats; nothing is buffered
// beyond one row (one Parquet row group for Parquet). Formats:
//
//   - sharegpt: SpecForge/ShareGPT conversations JSONL, one line per done
//     sample: id, conversations (the whole conversation: every input turn
//     and every regenerated answer, with reasoning_content and structured
//     tool_calls; tool results name their call by tool_call_id), tools and
//     partition. CheckShareGPTLine is the contract each line meets. Run
//     details (lane, finish reason, usage, endpoint, attempts, per-turn
//     details, why a conversation ended early) only with Options.Metadata
//     full. A truncated answer (finish_reason "length") is only exported
//     when the truncated rule is off, flagged "truncated": true. Every line
//     has the same keys at every depth (null, "", false or [] where a row
//     has nothing; tools and sampling as JSON text; content parts as
//     text), because trainers read the file through loaders that take the
//     columns from the first rows (rows.go). With Options.TokenIDs, lines
//     without ids go to <name>.sharegpt.no-token-ids.jsonl (Parquet rows
//     to <name>.no-token-ids.parquet), so each file is all-ids or no-ids.
//     With Options.TokenRows turn, each done sample gives one row per
//     assistant turn (turns.go), id "<sample id>/turn<k>", in both files.
//   - openai-batch: OpenAI batch output lines (custom_id, response.body as a
//     chat.completion, error) for done samples, and a separate errors file
//     for rejected and dead samples.
//   - parquet: one row per done sample, zstd-compressed, in the ShareGPT
//     line's layout (conversations, the whole conversation, as the
//     standard 3-level LIST that pyarrow and datasets read; tools as JSON
//     text) with run details and provenance as columns beside it.
//
// Only done (accepted) samples go to these training files. Rejected
// samples are always written to <name>.rejected.jsonl with their rule,
// evidence and the conversation up to the refused answer.
//
// Every record carries the sample id, "<partition>/<key>", and its
// source_id, the key alone: the source row's id field when the source maps
// one (id: in the job), so a record joins back to its source row; otherwise
// the first 32 hex digits of a SHA-256 of the partition and the request
// content, stable across runs. (custom_id is the sample id in openai-batch.)
//
// Dead letters (dead samples and rows that could not be ingested) are always
// written to <name>.dead.jsonl: dead samples in id order, then bad source
// rows in source order (file, then line), each with its file:line origin
// (a dead sample's is the row it was made from).
// Both are streamed from the store, never loaded whole: every row of a
// source may be bad.
//
// Each finished row is decoded once (record.go) and shared by every
// writer: its body through conversation.Decode and each stored answer
// through reply.Decode, the two named formats that cross the store; the
// package keeps no copy of either shape. (sharegptMessage is the output
// line's own message, in SpecForge's key order with null content as "".)
// ExportWith opens the writers (openWriters), streams the rows to them
// (exporter), then syncs, describes and renames (writers.finish,
// describe, renameAll).
//
// Verify (verify.go, verify_records.go) checks an export: every file the
// manifest lists (bytes, SHA-256, rows), no regen-named file left out of
// it, and every record against the store, rendered again through the same
// sinks into checkers (lineChecker, parquetChecker) instead of files, with
// the manifest's export settings; each file's first mismatch is a Problem
// naming its line (row) and sample id. ExportWith runs it on the files it
// has just written, passing over samples finished since it began.
//
// Every file is written to a hidden temporary file in the output directory,
// fsynced, and renamed over the final name only after every row was written
// to every file, so a crash or error leaves the previous export intact and
// never a torn line. The package never changes the store.
package export
