// Package source streams dataset files (JSONL, gzipped JSONL, Parquet) and
// maps their rows to samples: canonical chat prompts with stable ids.
//
// Read resolves a job.Source path (a file, a glob, or a directory whose
// *.jsonl, *.jsonl.gz and *.parquet files are read in name order) and calls
// emit once per good row and bad once per row that cannot become a sample.
// It never holds more than one row (one Parquet batch) in memory: JSONL is
// read line by line through bufio with a cap on the line length (a longer
// line becomes a BadRow and is skipped without being buffered), Parquet
// through a schema-driven generic reader in small batches. Gzip is detected
// from the file's magic bytes. Blank lines are skipped and are not rows.
// Problems with one row are BadRows naming the field (path:line for JSONL,
// path:row N with N the 0-based row index for Parquet); problems with a
// whole file (missing path, corrupt gzip stream, unreadable Parquet footer,
// a mapped column the Parquet schema lacks) stop Read with an error.
//
// Mapping. Exactly one of Conversations (ShareGPT), Messages (OpenAI) or
// Prompt (a plain string, sent as one user message) names the turns.
// ShareGPT `from` values map to roles (case-insensitively): human and user to
// user; gpt, assistant, chatgpt, bard, bing and model to assistant; system to
// system; observation, function_response, tool and ipython to tool. Turns
// written with role/content keys are accepted too. A function_call turn is
// the JSON {"name", "arguments"} of a recorded call: it becomes an assistant
// message with structured tool_calls (id call_<turn index>, arguments as a
// JSON string), merged into the assistant message right before it when
// there is one (text then call, parallel calls); every tool result is
// linked by tool_call_id to the next unanswered call of the answer before
// it, and a result with no call left to answer is a BadRow. OpenAI messages
// keep role and content (a string, content parts, or null beside
// tool_calls) and pass name, tool_calls and tool_call_id through; a tool
// result without an id is linked the same way. A system prompt (the
// literal System, else the SystemField value when non-empty) is prepended
// unless the conversation already starts with a system message, with
// StripSystemPrefix (glaive's "SYSTEM:") and the spaces after it removed
// from whichever system prompt is used. Tools may be an array or a string
// holding a JSON array or concatenated JSON objects (glaive style); bare
// function schemas {name, description, parameters} are wrapped as
// {"type":"function","function":{...}}. A missing or null tools or system
// field means none; a missing turns or id field is a BadRow.
//
// Turn plan (see package conversation). With Regenerate "last" the prompt
// is everything up to and including the last non-assistant turn, the
// history as the dataset wrote it, and one answer is regenerated. With
// "all" (the default) every run of assistant turns after the first user
// turn is an answer to regenerate: the body's messages are the input of
// the first one, and each later answer is a turn whose input is what the
// dataset has before it (a user message, or tool results together with the
// recorded calls they answer). A conversation ending with a user or tool
// turn gets one more answer at the end.
//
// Body is written by conversation.Encoder, which owns its shape and bytes:
// {"messages":[...],"tools":[...],"turns":[...]} (tools and turns only when
// present) with a fixed key order and no HTML escaping, so the same content
// always gives the same bytes; a body without turns is the one regen has
// always written. When the row has answers of its own, "original" follows:
// the dataset's answer to each regenerated turn (its run of assistant
// messages, tool calls structured), kept for review beside the model's and
// never sent; a samples_per_prompt copy's "seed" comes last. ID is
// Partition + "/" + the mapped id value (string or number), or, without an
// id mapping, Partition + "/" + the first 32 hex digits of
// sha256(Partition + "\x00" + the Encoder's key, the body without
// "original" and "seed"): stable and independent of row order, and the
// same as before regen kept the dataset's answers. PromptTokens is only an
// estimate for lane assignment, of the first turn's prompt: (bytes of
// message contents and tool calls + bytes of the tools JSON) / 4, plus 4 per
// message.
//
// Files: read.go streams files, fields.go reads row fields and words row
// errors, sharegpt.go, openai.go and tools.go map the row layouts,
// turns.go cuts the turn plan, mapper.go hands it to the body encoder,
// copies.go makes samples_per_prompt copies, inspect.go looks at a source
// without ingesting. testdata/bodies.golden pins the bytes and ids of
// every mapping (TestBodyGolden): a change there changes sample ids.
//
// The package reads files and calls back; it does not store, dedupe or log.
package source
