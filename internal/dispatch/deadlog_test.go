package dispatch

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

// logLines is a concurrency-safe log sink a test reads back by line.
type logLines struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logLines) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// with returns the lines holding msg and every one of fields.
func (l *logLines) with(msg string, fields ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range strings.Split(l.b.String(), "\n") {
		ok := strings.Contains(line, `msg="`+msg+`"`)
		for _, f := range fields {
			ok = ok && strings.Contains(line, f)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

// TestEveryDeadLetterLogged: each dead letter at dispatch has its own log
// line, whether the server refused it (two 400s at the same moment, which
// a rate-limited line would merge) or it was never sent (a body no request
// can be built from); answered samples have none.
func TestEveryDeadLetterLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		addBodies(st, "short", map[string]string{
			"bad": `{"messages":[]}`, "r1": chat3("r1"), "r2": chat3("r2"), "good": chat3("good"),
		})
		ts := &turnServer{answer: func(s sent) (llm.Result, error) {
			if strings.HasPrefix(s.sample, "r") {
				return llm.Result{}, &llm.Error{Class: llm.BadRequest, Status: 400, Msg: "prompt refused: " + s.sample}
			}
			return llm.Result{Content: "x", FinishReason: "stop"}, nil
		}}
		var logs logLines
		cfg := baseConfig(st, []Endpoint{{URL: "http://a", Client: ts.chatter()}})
		cfg.Logger = logs.logger()
		d := mustNew(t, cfg)
		if err := d.Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		for _, id := range []string{"r1", "r2"} {
			if s := st.get(id); s.state != store.Dead {
				t.Fatalf("%s = %s, want dead", id, s.state)
			}
			if got := logs.with("sample dead-lettered", "sample="+id, "sent=true", "attempts=1", "prompt refused: "+id); len(got) != 1 {
				t.Errorf("%s: %d dead-letter lines, want 1:\n%s", id, len(got), logs.b.String())
			}
		}
		if got := logs.with("sample dead-lettered", "sample=bad", "sent=false", "build request"); len(got) != 1 {
			t.Errorf("unsent: %d dead-letter lines, want 1:\n%s", len(got), logs.b.String())
		}
		if all := logs.with("sample dead-lettered"); len(all) != 3 {
			t.Errorf("%d dead-letter lines, want 3 (r1, r2, bad):\n%s", len(all), strings.Join(all, "\n"))
		}
	})
}
