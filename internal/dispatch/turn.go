package dispatch

import (
	"fmt"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/reply"
	"github.com/regen-dev/regen/internal/store"
)

// turn is the request a claim stands for: turn index of the sample's plan,
// built from the answers stored for the turns before it.
type turn struct {
	index int
	plan  *conversation.Plan
	// body is the request; parts, when body is nil, the request in
	// pieces, a kept history's and what this turn adds (history.go).
	body  []byte
	parts [][]byte
	// members are the request's top-level members (llm.Request.Members),
	// nil when the client must walk body.
	members []llm.Member
	tools   []string // declared tool names, for the quality rules
	// stored is the answer stored for this turn when the conversation goes
	// on (storeOp), for the history its next turn reuses (history.go),
	// with the endpoint it was stored from and its context (priorContext).
	stored    []byte
	storedAt  string
	storedCtx float64
}

// prepareTurn builds the request body for the claimed sample's turn: from
// hist, what the conversation's turn before kept (history.go), when there
// is one (startAll passes it only when it fits the claim), else from the
// store (p: c's body decoded already, or nil). An error means the stored
// sample cannot make a request at all.
func (d *Dispatcher) prepareTurn(c store.Claimed, hist *convHistory, p *conversation.Plan) (*turn, error) {
	if hist != nil {
		if t := d.nextTurn(hist); t != nil {
			return t, nil
		}
	}
	if c.Kept {
		// Nothing to build it from but what was kept: NextRequest failed
		// where Request, its equal, would fail too.
		return nil, fmt.Errorf("turn %d: the conversation's kept history does not build it", conversation.Ordinal(c.Turn))
	}
	if p == nil {
		var err error
		if p, err = conversation.DecodeStored(c.Body); err != nil {
			return nil, err
		}
	}
	t := &turn{index: c.Turn, plan: p, tools: p.ToolNames()}
	if len(c.Prior) != c.Turn {
		return nil, fmt.Errorf("turn %d: %d earlier answers handed over", conversation.Ordinal(c.Turn), len(c.Prior))
	}
	// Only what the history needs of each earlier answer is decoded: not
	// its token ids, which hold its whole prompt (reply.DecodeHistory).
	prior := make([]llm.Result, 0, len(c.Prior))
	for i, r := range c.Prior {
		a, err := reply.DecodeHistoryQuoted(r)
		if err != nil {
			return nil, fmt.Errorf("turn %d: decode stored answer to turn %d: %w", conversation.Ordinal(c.Turn), conversation.Ordinal(i), err)
		}
		prior = append(prior, a)
	}
	body, err := p.Request(c.Turn, prior, d.cfg.KeepReasoning)
	if err != nil {
		return nil, err
	}
	t.body = body
	t.members = p.Members(c.Turn, t.body)
	return t, nil
}

// request is t's request in pieces: its body alone, or its parts.
func (t *turn) request() [][]byte {
	if t.parts != nil {
		return t.parts
	}
	return [][]byte{t.body}
}

// nextLane is the lane for the turn after t, given its answer: the job's
// lane rule applied to the next prompt's estimated size (the answered
// prompt, the answer and the next input), or "" to stay in the same lane.
func (d *Dispatcher) nextLane(c store.Claimed, t *turn, res llm.Result) string {
	if d.cfg.LaneFor == nil {
		return ""
	}
	est := res.Usage.PromptTokens + res.Usage.CompletionTokens + t.plan.InputBytes(t.index+1)/4 + 8
	lane := d.cfg.LaneFor(c.Partition, est)
	if _, ok := d.laneByName[lane]; !ok {
		return ""
	}
	return lane
}
