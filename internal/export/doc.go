// Package export turns the finished samples of a store into dataset files.
//
// Export reads store.Store.Finished once, in sample-id order, and streams
// every row to the writers of the requested formats; nothing is buffered
// beyond one row (one Parquet row group for Parquet). Formats:
//
//   - sharegpt: SpecForge/ShareGPT conversations JSONL, one line per done
//     sample; truncated completions (finish_reason "length") are kept and
//     flagged "truncated": true.
//   - openai-batch: OpenAI batch output lines (custom_id, response.body as a
//     chat.completion, error) for done samples, and a separate errors file
//     for rejected and dead samples.
//   - parquet: one row per done sample, zstd-compressed, messages as the
//     standard 3-level LIST that pyarrow and datasets read.
//
// Every record carries the sample id, "<partition>/<key>", and its
// source_id, the key alone: the source row's id field when the source maps
// one (id: in the job), so a record joins back to its source row; otherwise
// the first 32 hex digits of a SHA-256 of the partition and the request
// content, stable across runs. (custom_id is the sample id in openai-batch.)
//
// Dead letters (dead samples and rows that could not be ingested) are always
// written to <name>.dead.jsonl: dead samples in id order, then bad source
// rows in source order (file, then line), each with its file:line origin.
// Both are streamed from the store, never loaded whole: every row of a
// source may be bad.
//
// Every file is written to a hidden temporary file in the output directory,
// fsynced, and renamed over the final name only after every row was written
// to every file, so a crash or error leaves the previous export intact and
// never a torn line. The package never changes the store.
package export
