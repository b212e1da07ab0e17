package llm

import (
	"errors"
	"fmt"
	"time"
)

// A server that ignores max_tokens can stream for ever (issue 22 saw one
// grow the runner from 29 MB to 6.5 GB in 89 s with 64 KB chunks). Every
// stream therefore has a budget derived from its max_tokens, and a stream
// past it is cut and blamed on that answer (Retryable: an attempt is
// spent, and the sample dead-letters with the reason in the end).
const (
	// budgetBytesPerToken is the answer bytes allowed per max_tokens token:
	// far above any tokenizer's average (3 to 5 bytes of text per token),
	// so only a runaway stream meets it.
	budgetBytesPerToken = 64
	// budgetBaseBytes is added to every byte budget.
	budgetBaseBytes = 1 << 20
	// budgetNoMaxBytes is the byte budget of a request without max_tokens.
	budgetNoMaxBytes = 32 << 20
	// budgetMinMargin is the least number of chunks allowed past max_tokens.
	budgetMinMargin = 256
)

// budget bounds what one stream may deliver.
type budget struct {
	maxTokens int
	// chunks is how many chunks carrying a delta are allowed: max_tokens
	// plus half again (at least 256), since an engine may split one token's
	// text between reasoning, content and tool-call chunks; 0 = no limit.
	chunks int
	// bytes bounds the answer kept in memory: text, reasoning, tool calls
	// and 4 bytes per token id.
	bytes int64
}

func newBudget(maxTokens int) budget {
	if maxTokens <= 0 {
		return budget{bytes: budgetNoMaxBytes}
	}
	return budget{
		maxTokens: maxTokens,
		chunks:    maxTokens + max(maxTokens/2, budgetMinMargin),
		bytes:     budgetBaseBytes + budgetBytesPerToken*int64(maxTokens),
	}
}

// check returns the error that cuts a stream which has sent chunks delta
// chunks and size bytes of answer, or nil while it is within budget.
func (b budget) check(chunks int, size int64) error {
	var why string
	switch {
	case b.chunks > 0 && chunks > b.chunks:
		why = fmt.Sprintf("%d chunks, more than max_tokens %d allows (%d)", chunks, b.maxTokens, b.chunks)
	case size > b.bytes:
		why = fmt.Sprintf("%d bytes of answer, more than the %d allowed", size, b.bytes)
		if b.maxTokens > 0 {
			why += fmt.Sprintf(" for max_tokens %d", b.maxTokens)
		}
	default:
		return nil
	}
	return &Error{Class: Retryable, Msg: "chat stream: cut after " + why + ": the server does not stop at max_tokens"}
}

// ErrNoProgress is wrapped by the ServerDown error that cuts a stream
// which keeps sending bytes without a token: SSE comments (": keepalive"),
// other non-data fields, blank lines or data chunks with nothing in them.
// Whose fault that is, the sample's or the server's, is the dispatcher's
// call: it depends on whether the server's other requests progress.
var ErrNoProgress = errors.New("stream without progress")

// drift is what a stream sent since it last progressed (a token, or token
// ids): the bytes of every line that brought nothing count against the
// stream's byte budget, and such lines for longer than the idle timeout
// end it, as silence would.
type drift struct {
	bytes int64     // bytes of the lines that brought nothing, over the whole stream
	since time.Time // the last progress, or when the body started
}

// line accounts one line of n bytes (its ending included) and returns the
// error that cuts the stream, or nil. answer is the answer's bytes so far.
func (d *drift) line(n int, progressed bool, b budget, answer int64, idle time.Duration, now time.Time) error {
	if progressed {
		d.since = now
		return nil
	}
	d.bytes += int64(n)
	var why string
	switch {
	case answer+d.bytes > b.bytes && answer <= b.bytes:
		why = fmt.Sprintf("%d bytes that carried no token (comments, keep-alives, empty chunks) beside %d of answer, more than the %d allowed", d.bytes, answer, b.bytes)
		if b.maxTokens > 0 {
			why += fmt.Sprintf(" for max_tokens %d", b.maxTokens)
		}
	case idle > 0 && now.Sub(d.since) > idle:
		why = fmt.Sprintf("no token for %s while the server sent %d bytes that carried none (comments, keep-alives, empty chunks)", now.Sub(d.since).Round(time.Millisecond), d.bytes)
	default:
		return nil
	}
	return &Error{Class: ServerDown, Msg: "chat stream: cut after " + why, Err: ErrNoProgress}
}
