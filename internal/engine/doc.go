// Package engine describes the inference servers regen drives (SGLang, vLLM,
// llama.cpp's llama-server and regen's own simulator) as plain data: how to
// launch one, how to tell it is ready and healthy, which Prometheus metrics
// mean what, and what its log lines say.
//
// A Dialect is pure description; it never starts processes or performs I/O
// beyond reading its own executable path for the simulator. Launching and
// watching belong to package supervise, scraping to package probe.
//
// ParseLogLine recognises batch statistics, retraction warnings, the ready
// line and fatal crash signatures of every engine. The patterns come from
// the engines' sources as summarised in docs/engines.md §3, §5, §6 and §7;
// a line that matches nothing yields an event of Kind None.
package engine
