// Package review puts one stored sample together for a person to read:
// every turn's input, the dataset's own answer beside the regenerated one
// (reasoning, tool calls, the tool results that followed), where and how
// each answer was made (lane, attempts, finish reason, usage, endpoint),
// and why the conversation ended early, was rejected (rule and evidence)
// or dead-lettered. The dashboard's sample page and `regen show` both
// render a Sample; this package only reads a store.Row and decodes, it
// never queries or writes the store.
package review
