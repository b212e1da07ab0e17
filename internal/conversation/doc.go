// Package conversation owns a sample's body: the prompt, the tools and the
// turn plan that says which assistant turns are regenerated, and how the
// regenerated answers are put back together into the request for the next
// turn and into the conversation export writes.
//
// The body is a contract between the source that writes it, the store that
// keeps it, and dispatch, export and review that read it, and sample ids
// hash its bytes; so its types (Body, Message, Turn, ToolCall), its writer
// (Encoder, in body.go) and its reader (Decode) live here together and
// nowhere else. Encoder writes a Body's keys in a fixed order, each only
// when non-empty, without HTML escaping, a recorded call's id even when
// empty; its key (the body without "original" and "seed") is what hash ids
// are made from, and WithSeed adds a copy's seed. These bytes never change
// for a given Body: source's TestBodyGolden pins them for every mapping.
//
// A body is a JSON object:
//
//	{"messages": [...], "tools": [...], "turns": [{"calls": [...], "input": [...]}, ...], "original": [[...], ...], "seed": N}
//
// seed, present on the samples of a source with samples_per_prompt > 1, is
// sent as the request's seed for every turn. original, the dataset's own
// answers, is kept for review and never sent.
// messages is the input of turn 0: everything before the first answer the
// job regenerates (system prompt, first user message, and any leading
// context). Each entry of turns is one later turn: input holds the messages
// the dataset has between the previous answer and the next (a user message,
// or the tool results of a recorded tool call), and calls holds the tool
// calls the dataset recorded in the answer those tool results reply to. A
// body without turns is a single turn, which is also the shape of every
// sample stored before multi-turn regeneration existed; such a body is sent
// to the server byte for byte.
//
// The request for turn k is turn 0's input, then for every earlier turn j
// the model's own answer to it followed by turn j+1's input: every answer
// in the history is regenerated, never the dataset's. Reasoning content of
// earlier answers is kept in that history or left out (what thinking chat
// templates expect), as the caller asks.
//
// Continue decides whether the conversation can go on after turn k's
// answer. It can when the next input starts with a user message and the
// answer called no tool, or when the next input holds tool results and the
// answer's tool calls match the recorded ones. Matching is exact and
// positional: the same number of calls, and for each position the same
// function name and arguments equal as JSON values (parsed, so key order,
// whitespace and a string-encoded object do not matter, but every value
// does). On a match the tool results are linked to the model's call ids.
// Otherwise the sample ends at turn k, with the reason Continue returns;
// its answers so far are a complete, faithful conversation.
package conversation
