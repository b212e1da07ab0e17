package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/llm"
)

// TestStreamedTokensCountAsTheyArrive (issue 30 item 4): the views' token
// count grows chunk by chunk while an answer streams, at the tokens per
// chunk the endpoint's earlier answers showed (a server that puts 4 tokens
// in a chunk), and ends at the answer's usage; it is not credited all at
// once when the answer completes. A failed request keeps what it streamed.
func TestStreamedTokensCountAsTheyArrive(t *testing.T) {
	const chunks, perChunk = 10, 4
	st := newFakeStore()
	st.add("short", "s", 3)
	step, streamed := make(chan struct{}), make(chan struct{})
	eps, _ := fleet(newTracker(), func(ctx context.Context, c call1) (llm.Result, error) {
		for range chunks {
			c.onDelta(1)
			streamed <- struct{}{}
			<-step
		}
		if c.id == "s-00001" && c.n == 1 {
			return llm.Result{}, &llm.Error{Class: llm.Retryable, Msg: "reset mid-stream"}
		}
		return llm.Result{FinishReason: "stop", Usage: llm.Usage{PromptTokens: 5, CompletionTokens: chunks * perChunk}}, nil
	}, "http://a")
	cfg := baseConfig(st, eps)
	cfg.Lanes = []LaneConfig{{Name: "short", Concurrency: 1, MaxTokens: 100}}
	cfg.BaseDelay, cfg.MaxDelay = time.Millisecond, time.Millisecond
	d := mustNew(t, cfg)
	done := make(chan error, 1)
	go func() { done <- d.Run(t.Context()) }()
	got := func() int64 { return d.Snapshot().Endpoints[0].StreamedTokens }

	// The first answer: tokens per chunk unknown, one each; then its usage.
	for i := 1; i <= chunks; i++ {
		<-streamed
		if n := got(); n != int64(i) {
			t.Errorf("first answer, chunk %d: %d tokens streamed, want %d", i, n, i)
		}
		step <- struct{}{}
	}
	// Every later request streams 4 tokens a chunk, as the first answer
	// taught; the first chunk of the second shows the first topped up.
	<-streamed
	if first := got() - perChunk; first != chunks*perChunk {
		t.Errorf("after the first answer: %d tokens streamed, want its usage %d", first, chunks*perChunk)
	}
	before, requests := int64(chunks*perChunk), 1
	for {
		requests++
		for i := 1; i <= chunks; i++ {
			if i > 1 {
				<-streamed
			}
			if n, want := got(), before+int64(i*perChunk); n != want {
				t.Errorf("request %d, chunk %d: %d tokens streamed, want %d", requests, i, n, want)
			}
			step <- struct{}{}
		}
		before += chunks * perChunk // the failed request keeps its 40 too
		select {
		case <-streamed:
			continue
		case err := <-done:
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
		}
		break
	}
	s := d.Snapshot().Endpoints[0]
	if requests != 4 || s.StreamedTokens != int64(requests*chunks*perChunk) || s.CompletionTokens != 3*chunks*perChunk {
		t.Errorf("%d requests, streamed %d, usage %d; want 4 requests (one failed), 160 streamed and 120 in the 3 answers' usage",
			requests, s.StreamedTokens, s.CompletionTokens)
	}
}
