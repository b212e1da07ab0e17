package export

import (
	"encoding/json"
	"fmt"

	"github.com/regen-dev/regen/internal/job"
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

// sharegptLine is one SpecForge/ShareGPT conversation: id and
// conversations, the tools the conversation may call (JSON text, "[]" when
// none) and the partition. Every key is on every line of a file, null or
// empty where a row has nothing (docs/training-data.md, "Same keys on
// every row"). Run details come only with full metadata, token fields
// only with token ids.
type sharegptLine struct {
	ID            string            `json:"id"`
	SourceID      string            `json:"source_id"`
	Conversations []sharegptMessage `json:"conversations"`
	Tools         string            `json:"tools"`
	Partition     string            `json:"partition"`
	Truncated     bool              `json:"truncated"`
	// ChatTemplateKwargs are the template switches the server rendered the
	// last answer with, e.g. {"thinking":true} (templateKwargs).
	ChatTemplateKwargs *string `json:"chat_template_kwargs"`
	*runDetails
	*turnKeys
	*tokenFields
	*missingTokens
}

// runDetails is what output.metadata: full adds to a record.
type runDetails struct {
	Lane         string        `json:"lane"`
	FinishReason string        `json:"finish_reason"`
	Usage        usageLine     `json:"usage"`
	Endpoint     string        `json:"endpoint"`
	Attempts     int           `json:"attempts"`
	EndReason    string        `json:"end_reason"`
	Turns        []turnDetails `json:"turns"` // empty for a one-turn conversation
	// Seed is the sampling seed every request of the sample sent (one of
	// samples_per_prompt answers to one prompt), null when none.
	Seed *int64 `json:"seed"`
	// Provenance is where the last answer came from: configuration
	// generation, model id, engine and version, sampling parameters.
	Provenance provenanceLine `json:"provenance"`
}

// turnDetails is one answer of a multi-turn conversation.
type turnDetails struct {
	Turn         int       `json:"turn"`
	Lane         string    `json:"lane"`
	FinishReason string    `json:"finish_reason"`
	Usage        usageLine `json:"usage"`
	Endpoint     string    `json:"endpoint"`
	Attempts     int       `json:"attempts"`
	// Provenance is where this answer came from.
	Provenance provenanceLine `json:"provenance"`
}

func details(r *record) *runDetails {
	last := provenanceOf(r.last())
	d := &runDetails{Lane: r.row.Lane, FinishReason: r.res.FinishReason, Usage: usageOf(r.res.Usage), Endpoint: r.row.Result.Endpoint,
		Attempts: r.row.Attempts, EndReason: r.row.Result.EndReason, Seed: r.plan.Seed, Turns: []turnDetails{}, Provenance: last}
	if len(r.row.Prior) == 0 {
		return d
	}
	for i, p := range r.row.Prior {
		d.Turns = append(d.Turns, turnDetails{Turn: p.Turn, Lane: p.Lane, FinishReason: r.answers[i].FinishReason,
			Usage: usageOf(r.answers[i].Usage), Endpoint: p.Endpoint, Attempts: p.Attempts, Provenance: provenanceOf(r.provs[i])})
	}
	d.Turns = append(d.Turns, turnDetails{Turn: r.row.Result.Turn, Lane: r.row.Lane, FinishReason: r.res.FinishReason,
		Usage: usageOf(r.res.Usage), Endpoint: r.row.Result.Endpoint, Attempts: r.row.Attempts, Provenance: last})
	return d
}

// sharegptSink writes the ShareGPT training file; with token ids, rows
// whose ids are unavailable go to a file of their own, so each file is
// all-ids or no-ids (docs/training-data.md, "What the export writes").
type sharegptSink struct {
	out, noIDs, trunc       *output
	enc, noIDsEnc, truncEnc lineEncoder
	full, tokens            bool
	profile                 Profile
	// noSystem counts the training file's rows without a system message,
	// under the SpecForge profile (SpecForge inserts its own).
	noSystem int
}

func newShareGPT(create createFunc, path string, side sides, full, tokens bool, profile Profile) (*sharegptSink, error) {
	af, err := create(path)
	if err != nil {
		return nil, err
	}
	s := &sharegptSink{out: &output{format: FormatShareGPT, af: af}, enc: newLineEncoder(af), full: full, tokens: tokens, profile: profile}
	open := func(path, format string) (*output, lineEncoder, error) {
		f, err := create(path)
		if err != nil {
			for _, o := range s.files() {
				o.af.abort()
			}
			return nil, lineEncoder{}, err
		}
		return &output{format: format, af: f}, newLineEncoder(f), nil
	}
	if side.noIDs != "" {
		if s.noIDs, s.noIDsEnc, err = open(side.noIDs, FormatShareGPTNoTokenIDs); err != nil {
			return nil, err
		}
	}
	if side.truncated != "" {
		if s.trunc, s.truncEnc, err = open(side.truncated, FormatShareGPTTruncated); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *sharegptSink) files() []*output {
	out := []*output{s.out}
	for _, o := range []*output{s.noIDs, s.trunc} {
		if o != nil {
			out = append(out, o)
		}
	}
	return out
}

// write writes a done sample's rows: SpecForge's are one per turn.
func (s *sharegptSink) write(r *record) error {
	return writeTrainingRows(r, r.turnRows || s.profile.specForge(), s.writeRow)
}

// writeTrainingRows hands a done sample's training rows (its conversation,
// or with turns one row per turn) to writeRow; other samples have none.
func writeTrainingRows(r *record, turns bool, writeRow func(*record) error) error {
	if r.row.State != store.Done {
		return nil
	}
	rows, err := r.rowsOf(turns)
	if err != nil {
		return err
	}
	for _, t := range rows {
		if err := writeRow(t); err != nil {
			return err
		}
	}
	return nil
}

// writeRow writes one training row: a conversation, or one turn of it,
// to the training file or the side file it belongs in.
func (s *sharegptSink) writeRow(r *record) error {
	var tokens *tokenFields
	out, enc := s.out, s.enc
	if s.tokens {
		if t := r.tokens(); t.Missing == "" {
			tokens = &tokenFields{InputIDs: t.InputIDs, LossMask: t.LossMask}
		} else {
			out, enc = s.noIDs, s.noIDsEnc
		}
	}
	if s.trunc != nil && r.truncated() {
		out, enc = s.trunc, s.truncEnc
	}
	var line any
	var err error
	if s.profile.specForge() {
		missing := ""
		if out == s.noIDs {
			missing = r.tokens().Missing
		}
		line, err = s.profile.specForgeLine(r, tokens, missing)
	} else {
		line = s.line(r, tokens)
	}
	if err == nil {
		err = enc.write(line)
	}
	if err != nil {
		return fmt.Errorf("sharegpt sample %s: %w", r.row.ID, err)
	}
	out.rows++
	if out == s.out && s.profile.specForge() && (len(r.conv) == 0 || r.conv[0].Role != "system") {
		s.noSystem++
	}
	return nil
}

// line is r's row in the layout both trainers read: with token ids,
// tokens or, when r has none, the reason why.
func (s *sharegptSink) line(r *record, tokens *tokenFields) sharegptLine {
	line := sharegptLine{
		ID:                 r.row.ID,
		SourceID:           r.sourceID(),
		Conversations:      sharegptMessages(r.conv),
		Tools:              toolsText(r.plan.Tools),
		Partition:          r.row.Partition,
		Truncated:          r.truncated(),
		turnKeys:           r.turnFields(),
		ChatTemplateKwargs: templateKwargs(r.last()),
	}
	if s.full {
		line.runDetails = details(r)
	}
	if s.tokens {
		line.tokenFields = tokens
		if tokens == nil {
			line.missingTokens = &missingTokens{TokenIDs: r.tokens().Missing}
		}
	}
	return line
}

// rejectedLine is one rejected sample with its rule, evidence and the
// conversation up to the refused answer, for a person to inspect.
type rejectedLine struct {
	ID            string            `json:"id"`
	SourceID      string            `json:"source_id"`
	Partition     string            `json:"partition"`
	Lane          string            `json:"lane"`
	Rule          string            `json:"rule"`
	Evidence      string            `json:"evidence"`
	Turn          int               `json:"turn"`
	Attempts      int               `json:"attempts"`
	FinishReason  string            `json:"finish_reason"`
	Usage         llm.Usage         `json:"usage"`
	Conversations []sharegptMessage `json:"conversations"`
	Tools         json.RawMessage   `json:"tools,omitempty"`
}

type rejectedSink struct {
	out *output
	enc lineEncoder
}

func newRejected(create createFunc, path string) (*rejectedSink, error) {
	af, err := create(path)
	if err != nil {
		return nil, err
	}
	return &rejectedSink{out: &output{format: FormatRejected, af: af}, enc: newLineEncoder(af)}, nil
}

func (s *rejectedSink) files() []*output { return []*output{s.out} }

func (s *rejectedSink) write(r *record) error {
	if r.row.State != store.Rejected {
		return nil
	}
	line := rejectedLine{ID: r.row.ID, SourceID: r.sourceID(), Partition: r.row.Partition, Lane: r.row.Lane, Rule: r.row.Rule, Evidence: r.row.Reason,
		Turn: r.row.Result.Turn, Attempts: r.row.Attempts, FinishReason: r.res.FinishReason, Usage: r.res.Usage,
		Conversations: sharegptMessages(r.conv), Tools: r.plan.Tools}
	if err := s.enc.write(line); err != nil {
		return fmt.Errorf("rejected sample %s: %w", r.row.ID, err)
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

func newBatch(create createFunc, path, errPath string) (*batchSink, error) {
	done, err := create(path)
	if err != nil {
		return nil, err
	}
	errs, err := create(errPath)
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
		line.Error = &batchError{Code: CodeRejected, Message: r.row.Rule + ": " + r.row.Reason}
	default:
		line.Error = &batchError{Code: CodeDeadLetter, Message: r.row.Reason}
	}
	if err := enc.write(line); err != nil {
		return fmt.Errorf("openai-batch sample %s: %w", r.row.ID, err)
	}
	out.rows++
	return nil
}

// deadLine is one dead letter: a dead sample (id set, with the row it came
// from as origin) or a source row that never became a sample (origin set).
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
	out    *output
	enc    lineEncoder
	jobDir string // origins are written relative to it
}

func newDead(create createFunc, path, jobDir string) (*deadSink, error) {
	af, err := create(path)
	if err != nil {
		return nil, err
	}
	return &deadSink{out: &output{format: FormatDead, af: af}, enc: newLineEncoder(af), jobDir: jobDir}, nil
}

func (s *deadSink) files() []*output { return []*output{s.out} }

func (s *deadSink) write(r *record) error {
	if r.row.State != store.Dead {
		return nil
	}
	return s.put(deadLine{ID: r.row.ID, SourceID: r.sourceID(), Partition: r.row.Partition, Lane: r.row.Lane, Origin: job.RelTo(s.jobDir, r.row.Origin),
		Reason: r.row.Reason, Attempts: r.row.Attempts})
}

func (s *deadSink) ingestError(e store.IngestError) error {
	return s.put(deadLine{Partition: e.Partition, Origin: job.RelTo(s.jobDir, e.Origin), Field: e.Field, Reason: e.Reason})
}

func (s *deadSink) put(l deadLine) error {
	if err := s.enc.write(l); err != nil {
		return fmt.Errorf("dead letter %s%s: %w", l.ID, l.Origin, err)
	}
	s.out.rows++
	return nil
}
