// Command missdiag reads the simulator's miss log (sim knob miss_log, one
// JSON line per conversation turn) and prints why later turns did not find
// their previous prompt and answer cached: the missed tokens per cause,
// when the evictions happened, why turns waited in the server's queue,
// and the later turns' misses against how much context each server held.
//
//	go run ./bench/sweep -workloads mtlong -grid none -balance affinity -sim miss_log=/tmp/miss.jsonl
//	go run ./bench/missdiag /tmp/miss.jsonl
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
)

// record is one line of the miss log (sim's missRecord).
type record struct {
	Server     string  `json:"server"`
	At         float64 `json:"at"`
	Queued     float64 `json:"queued"`
	Prompt     int     `json:"prompt"`
	Hit        int     `json:"hit"`
	Expected   int     `json:"expected"`
	Cause      string  `json:"cause"`
	EvictedAt  float64 `json:"evicted_at"`
	InsertedAt float64 `json:"inserted_at"`
	Arrived    float64 `json:"arrived"`
	AnswerAt   float64 `json:"answer_at"`
	Conv       string  `json:"conv"`
	Output     int     `json:"output"`
	Blocked    string  `json:"blocked"`
	Shared     int     `json:"shared"`
	SharedKey  string  `json:"shared_key"`
	Pool       *struct {
		Used      int `json:"used"`
		Evictable int `json:"evictable"`
		Running   int `json:"running"`
		Waiting   int `json:"waiting"`
		Reserved  int `json:"reserved"`
		Need      int `json:"need"`
	} `json:"pool"`
}

func (r record) later() bool { return r.Cause != "first" && r.Cause != "done" }

func (r record) missed() int { return max(r.Expected-r.Hit, 0) }

func main() {
	pool := 231120
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: missdiag miss.jsonl")
		os.Exit(2)
	}
	recs, err := read(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "missdiag:", err)
		os.Exit(1)
	}
	causes(os.Stdout, recs)
	evictions(os.Stdout, recs)
	heldVersusMiss(os.Stdout, recs, pool)
}

func read(path string) ([]record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read miss log: %w", err)
	}
	defer f.Close()
	var recs []record
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		var r record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("read miss log %s line %d: %w", path, n, err)
		}
		recs = append(recs, r)
	}
	return recs, sc.Err()
}

// causes prints the later turns' hit against the ideal and the missed
// tokens per cause.
func causes(w io.Writer, recs []record) {
	type sum struct{ turns, missed int }
	by := map[string]*sum{}
	var prompt, hit, expected, missed, turns int
	for _, r := range recs {
		if !r.later() {
			continue
		}
		turns++
		prompt, hit, expected, missed = prompt+r.Prompt, hit+r.Hit, expected+r.Expected, missed+r.missed()
		if by[r.Cause] == nil {
			by[r.Cause] = &sum{}
		}
		by[r.Cause].turns++
		by[r.Cause].missed += r.missed()
	}
	if turns == 0 {
		fmt.Fprintln(w, "no later turns")
		return
	}
	fmt.Fprintf(w, "later turns %d: prompt %d tokens, cached %d (%.1f%%); previous prompt + answer %d (%.1f%%: the ideal), new questions %.1f%%\n",
		turns, prompt, hit, pct(hit, prompt), expected, pct(expected, prompt), pct(prompt-expected, prompt))
	names := make([]string, 0, len(by))
	for k := range by {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool { return by[names[i]].missed > by[names[j]].missed })
	fmt.Fprintf(w, "%-16s %7s %12s %9s %9s\n", "cause", "turns", "missed tok", "of missed", "of prompt")
	for _, k := range names {
		s := by[k]
		fmt.Fprintf(w, "%-16s %7d %12d %8.1f%% %8.1f%%\n", k, s.turns, s.missed, pct(s.missed, missed), pct(s.missed, prompt))
	}
}

// evictions prints when evicted histories went (before the turn arrived
// or while it waited in the server's queue), why turns waited, and the
// pool at the evictions.
func evictions(w io.Writer, recs []record) {
	var before, queued, beforeTok, queuedTok int
	var gaps, waits, used, evictable, running, waiting, reserved []float64
	blocked := map[string][2]int{}
	for _, r := range recs {
		if !r.later() {
			continue
		}
		if r.Queued > 0 {
			b := blocked[r.Blocked]
			b[0]++
			if r.missed() > 0 {
				b[1]++
			}
			blocked[r.Blocked] = b
		}
		if r.AnswerAt >= 0 {
			gaps = append(gaps, r.Arrived-r.AnswerAt)
		}
		waits = append(waits, r.Queued)
		if r.EvictedAt < 0 || r.missed() == 0 {
			continue
		}
		if r.EvictedAt >= r.Arrived {
			queued, queuedTok = queued+1, queuedTok+r.missed()
		} else {
			before, beforeTok = before+1, beforeTok+r.missed()
		}
		if p := r.Pool; p != nil {
			used, evictable = append(used, float64(p.Used)), append(evictable, float64(p.Evictable))
			running, waiting, reserved = append(running, float64(p.Running)), append(waiting, float64(p.Waiting)), append(reserved, float64(p.Reserved))
		}
	}
	fmt.Fprintf(w, "evicted before the turn arrived: %d turns, %d tokens; while it waited in the server's queue: %d turns, %d tokens\n",
		before, beforeTok, queued, queuedTok)
	fmt.Fprintf(w, "previous answer to next arrival (s): %s; queue wait (s): %s\n", quantiles(gaps), quantiles(waits))
	fmt.Fprintf(w, "turns that waited, by why (turns, of them short): %v\n", blocked)
	fmt.Fprintf(w, "pool at those evictions: used %s, evictable %s, running %s, waiting %s, reserved output %s\n",
		quantiles(used), quantiles(evictable), quantiles(running), quantiles(waiting), quantiles(reserved))
}

func pct(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

// quantiles is "p10/median/p90" of xs.
func quantiles(xs []float64) string {
	if len(xs) == 0 {
		return "-"
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	q := func(f float64) float64 { return s[min(int(f*float64(len(s))), len(s)-1)] }
	return fmt.Sprintf("%.4g/%.4g/%.4g", q(0.1), q(0.5), q(0.9))
}
