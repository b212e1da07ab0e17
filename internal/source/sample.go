package source

import "encoding/json"

// Sample is one prompt read from a source.
type Sample struct {
	ID        string // row id field if mapped, else a hash of partition + canonical Body
	Partition string
	Body      json.RawMessage // canonical: {"messages":[...]} plus "tools" when present
	// PromptTokens is an estimate (characters / 4 over message contents and tools).
	PromptTokens int
	Origin       string // path:line for JSONL, path:row N for Parquet
	// Copy is j of the samples_per_prompt samples made from one row (0 for
	// the first, and for every sample of a source with one per prompt).
	Copy int
}

// BadRow is a row that cannot become a sample.
type BadRow struct {
	Partition string
	Origin    string // path:line or path:row N
	Field     string // offending field, "" when the row as a whole is bad
	Reason    string
}
