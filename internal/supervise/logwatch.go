package supervise

import (
	"bufio"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/regen-dev/regen/internal/engine"
)

const (
	tailLines     = 20
	maxFatalLines = 10
)

type fatalLine struct {
	cause string
	line  string
	at    time.Time
}

// logWatch reads the server's output. It never blocks on the supervisor:
// it records what it saw under a mutex and pokes notify without waiting, so
// a busy supervisor can never stall the server's writes to its pipe.
type logWatch struct {
	d      engine.Dialect
	out    io.Writer // rotating log file; nil = none
	now    func() time.Time
	notify chan struct{}

	mu         sync.Mutex
	ready      bool
	fatal      []fatalLine
	retracts   []time.Time
	lastGenAt  time.Time // last batch line showing generation
	capacity   int64
	tail       [tailLines]string
	tailN      int
	writeErr   error
	linesTotal int64
}

func newLogWatch(d engine.Dialect, out io.Writer, now func() time.Time) *logWatch {
	return &logWatch{d: d, out: out, now: now, notify: make(chan struct{}, 1), capacity: -1}
}

// run reads r until EOF or a read error.
func (w *logWatch) run(r io.Reader) {
	br := bufio.NewReaderSize(r, 64<<10)
	continued := false
	for {
		chunk, err := br.ReadSlice('\n')
		if len(chunk) > 0 {
			w.write(chunk)
			if !continued {
				w.observe(string(chunk))
			}
			continued = errors.Is(err, bufio.ErrBufferFull)
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

func (w *logWatch) write(chunk []byte) {
	if w.out == nil {
		return
	}
	if _, err := w.out.Write(chunk); err != nil {
		w.mu.Lock()
		w.writeErr = err
		w.mu.Unlock()
	}
}

func (w *logWatch) observe(line string) {
	for len(line) > 0 && (line[len(line)-1] == '\n' || line[len(line)-1] == '\r') {
		line = line[:len(line)-1]
	}
	ev := w.d.ParseLogLine(line)
	now := w.now()
	poke := false
	w.mu.Lock()
	w.linesTotal++
	w.tail[w.tailN%tailLines] = line
	w.tailN++
	switch ev.Kind {
	case engine.Ready:
		w.ready, poke = true, true
	case engine.Fatal:
		if len(w.fatal) < maxFatalLines {
			w.fatal = append(w.fatal, fatalLine{cause: ev.Cause, line: line, at: now})
		}
		poke = true
	case engine.Retract:
		w.retracts = append(w.retracts, now)
		if len(w.retracts) > 1000 {
			w.retracts = w.retracts[len(w.retracts)-1000:]
		}
	case engine.Batch:
		if ev.GenThroughput > 0 || (ev.Phase == "prefill" && ev.Running > 0) {
			w.lastGenAt = now
		}
	case engine.Capacity:
		w.capacity = ev.MaxTotalTokens
	}
	w.mu.Unlock()
	if poke {
		select {
		case w.notify <- struct{}{}:
		default:
		}
	}
}

func (w *logWatch) isReady() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ready
}

// rootCause returns the highest-priority fatal cause seen, its first line
// and when the first fatal line arrived; "" when none.
func (w *logWatch) rootCause() (cause string, lines []string, first time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	best := -1
	for _, f := range w.fatal {
		if p := engine.CausePriority(f.cause); p > best {
			best, cause = p, f.cause
		}
		lines = append(lines, f.line)
	}
	if len(w.fatal) > 0 {
		first = w.fatal[0].at
	}
	return cause, lines, first
}

func (w *logWatch) retractionsSince(t time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for i := len(w.retracts) - 1; i >= 0 && !w.retracts[i].Before(t); i-- {
		n++
	}
	return n
}

func (w *logWatch) generationAt() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastGenAt
}

// lastLines returns up to n of the most recent lines, oldest first.
func (w *logWatch) lastLines(n int) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	n = min(n, w.tailN, tailLines)
	out := make([]string, 0, n)
	for i := w.tailN - n; i < w.tailN; i++ {
		out = append(out, w.tail[i%tailLines])
	}
	return out
}
