// Package quality decides whether a generated answer is fit to train a
// drafter on. Its rules are pure functions of what was asked (Request) and
// what came back (llm.Result); Check returns the first rule that rejects
// the answer, with evidence a person can read, or an accepted Verdict.
//
// The dispatcher calls Check for every answer it would otherwise store as
// done (after escalation, so "truncated" means truncated in the biggest lane
// the sample could reach) and the store records the verdict: a rejected
// sample keeps its rule and evidence, goes to rejected.jsonl at export, and
// can be sent back with `regen requeue --rejected --rule R`.
//
// Rules, in the order Check applies them (cheap ones first):
//
//   - truncated: finish_reason "length".
//   - empty: no content and no tool call.
//   - reasoning: reasoning was asked for and reasoning_content is empty, or
//     thinking was disabled and reasoning_content is not empty.
//   - think_tags: a leftover <think> or </think> (or Kimi's ◁think▷,
//     ◁/think▷) in content or reasoning_content: the server's reasoning
//     parser did not separate the thinking, so the text would teach the
//     drafter the wrong tokens.
//   - tool_args: a tool call whose arguments are not a JSON object.
//   - tool_name: a tool call naming no tool the request declared.
//   - regex: a user pattern matched content or reasoning_content.
//   - repetition: some run of NGram words occurs more than MaxRepeats times
//     in content or in reasoning_content (a degenerate loop). Words are runs
//     of non-space characters, and every CJK character is a word of its own.
//
// The package holds no state between calls and never does I/O.
package quality
