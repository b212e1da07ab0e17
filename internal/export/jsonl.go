package export

import (
	"encoding/json"
	"fmt"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

// sink is one output format's writer over one or more atomic files.
type sink interface {
	write(r *record) error
	// files returns the files this sink writes, with their line counts.
	files() []*output
}

// output is one atomic file and the number of records written to it.
type output struct {
	format string
	af     *atomicFile
	rows   int
}

// sharegptLine is one SpecForge/ShareGPT conversation.
type sharegptLine struct {
	ID            string          `json:"id"`
	SourceID      string          `json:"source_id"`
	Conversations []any           `json:"conversations"`
	Tools         json.RawMessage `json:"tools,omitempty"`
	Partition     string          `json:"partition"`
	Lane          string          `json:"lane"`
	FinishReason  string          `json:"finish_reason"`
	Truncated     bool            `json:"truncated,omitempty"`
	Usage         llm.Usage       `json:"usage"`
	Endpoint      string          `json:"endpoint"`
	Attempts      int             `json:"attempts"`
}

type sharegptSink struct {
	out *output
	enc lineEncoder
}

func newShareGPT(path string) (*sharegptSink, error) {
	af, err := createAtomic(path)
	if err != nil {
		return nil, err
	}
	return &sharegptSink{out: &output{format: FormatShareGPT, af: af}, enc: newLineEncoder(af)}, nil
}

func (s *sharegptSink) files() []*output { return []*output{s.out} }

func (s *sharegptSink) write(r *record) error {
	if r.row.State != store.Done {
		return nil
	}
	conv := make([]any, 0, len(r.req.Messages)+1)
	for _, m := range r.req.Messages {
		conv = append(conv, m)
	}
	conv = append(conv, r.assistant())
	line := sharegptLine{
		ID:            r.row.ID,
		SourceID:      r.sourceID(),
		Conversations: conv,
		Tools:         r.req.Tools,
		Partition:     r.row.Partition,
		Lane:          r.row.Lane,
		FinishReason:  r.res.FinishReason,
		Truncated:     r.truncated(),
		Usage:         r.res.Usage,
		Endpoint:      r.row.Result.Endpoint,
		Attempts:      r.row.Attempts,
	}
	if err := s.enc.write(line); err != nil {
		return fmt.Errorf("sharegpt sample %s: %w", r.row.ID, err)
	}
	s.out.rows++
	return nil
}

// OpenAI batch output shapes.
type batchLine struct {
	ID       string         `json:"id"`
	CustomID string         `json:"custom_id"`
	SourceID string         `json:"source_id"`
	Response *batchResponse `json:"response"`
	Error    *batchError    `json:"error"`
}

type batchResponse struct {
	StatusCode int            `json:"status_code"`
	Body       chatCompletion `json:"body"`
}

type chatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   llm.Usage    `json:"usage"`
}

type chatChoice struct {
	Index        int       `json:"index"`
	Message      assistant `json:"message"`
	FinishReason string    `json:"finish_reason"`
}

type batchError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Error codes in the openai-batch errors file.
const (
	CodeRejected   = "rejected"
	CodeDeadLetter = "dead_letter"
)

type batchSink struct {
	done, errs       *output
	doneEnc, errsEnc lineEncoder
	n                int // batch_req_<n> counter over both files, in id order
}

func newBatch(path, errPath string) (*batchSink, error) {
	done, err := createAtomic(path)
	if err != nil {
		return nil, err
	}
	errs, err := createAtomic(errPath)
	if err != nil {
		done.abort()
		return nil, err
	}
	return &batchSink{
		done: &output{format: FormatOpenAIBatch, af: done}, doneEnc: newLineEncoder(done),
		errs: &output{format: FormatOpenAIBatch + "-errors", af: errs}, errsEnc: newLineEncoder(errs),
	}, nil
}

func (s *batchSink) files() []*output { return []*output{s.done, s.errs} }

func (s *batchSink) write(r *record) error {
	s.n++
	line := batchLine{ID: fmt.Sprintf("batch_req_%d", s.n), CustomID: r.row.ID, SourceID: r.sourceID()}
	out, enc := s.errs, s.errsEnc
	switch r.row.State {
	case store.Done:
		out, enc = s.done, s.doneEnc
		line.Response = &batchResponse{StatusCode: 200, Body: chatCompletion{
			ID:      "chatcmpl-" + r.row.ID,
			Object:  "chat.completion",
			Created: r.row.FinishedAt.Unix(),
			Model:   r.res.Model,
			Choices: []chatChoice{{Index: 0, Message: r.assistant(), FinishReason: r.res.FinishReason}},
			Usage:   r.res.Usage,
		}}
	case store.Rejected:
		line.Error = &batchError{Code: CodeRejected, Message: r.row.Reason}
	default:
		line.Error = &batchError{Code: CodeDeadLetter, Message: r.row.Reason}
	}
	if err := enc.write(line); err != nil {
		return fmt.Errorf("openai-batch sample %s: %w", r.row.ID, err)
	}
	out.rows++
	return nil
}

// deadLine is one dead letter: a dead sample (id set) or a source row that
// never became a sample (origin set).
type deadLine struct {
	ID        string `json:"id,omitempty"`
	SourceID  string `json:"source_id,omitempty"`
	Partition string `json:"partition"`
	Lane      string `json:"lane,omitempty"`
	Origin    string `json:"origin,omitempty"`
	Field     string `json:"field,omitempty"`
	Reason    string `json:"reason"`
	Attempts  int    `json:"attempts"`
}

type deadSink struct {
	out *output
	enc lineEncoder
}

func newDead(path string) (*deadSink, error) {
	af, err := createAtomic(path)
	if err != nil {
		return nil, err
	}
	return &deadSink{out: &output{format: "dead", af: af}, enc: newLineEncoder(af)}, nil
}

func (s *deadSink) files() []*output { return []*output{s.out} }

func (s *deadSink) write(r *record) error {
	if r.row.State != store.Dead {
		return nil
	}
	return s.put(deadLine{ID: r.row.ID, SourceID: r.sourceID(), Partition: r.row.Partition, Lane: r.row.Lane, Reason: r.row.Reason, Attempts: r.row.Attempts})
}

func (s *deadSink) ingestError(e store.IngestError) error {
	return s.put(deadLine{Partition: e.Partition, Origin: e.Origin, Field: e.Field, Reason: e.Reason})
}

func (s *deadSink) put(l deadLine) error {
	if err := s.enc.write(l); err != nil {
		return fmt.Errorf("dead letter %s%s: %w", l.ID, l.Origin, err)
	}
	s.out.rows++
	return nil
}
