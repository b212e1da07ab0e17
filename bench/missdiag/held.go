package main

import (
	"fmt"
	"io"
	"sort"
)

// A conversation on a server is, from its first turn's arrival to its
// last turn's end, queued (a turn waits in the server's queue), running,
// or idle (between turns); its context is its last prompt (and answer),
// of which its shared prefix (key, shared tokens) counts once per server
// however many held conversations share it, as admission counts it.
type change struct {
	at     float64
	conv   string
	tokens int
	state  string // queued, running, idle, gone
	key    string
	shared int
}

// timeline is one server's held context over time.
type timeline struct {
	at   []float64 // change times, sorted
	held []int     // context tokens of every held conversation after each change
	avg  map[string][2]float64
	span float64
}

func changes(recs []record) []change {
	last := map[string]float64{}
	for _, r := range recs {
		if r.Cause == "done" {
			last[r.Conv] = max(last[r.Conv], r.At)
		}
	}
	var cs []change
	for _, r := range recs {
		k, sh := r.SharedKey, r.Shared
		if r.Cause == "done" {
			cs = append(cs, change{r.At, r.Conv, r.Prompt + r.Output, "idle", k, sh})
			if r.At == last[r.Conv] {
				cs = append(cs, change{r.At, r.Conv, 0, "gone", k, sh})
			}
			continue
		}
		cs = append(cs, change{r.Arrived, r.Conv, r.Prompt, "queued", k, sh}, change{r.At, r.Conv, r.Prompt + r.Output, "running", k, sh})
	}
	sort.SliceStable(cs, func(i, j int) bool { return cs[i].at < cs[j].at })
	return cs
}

// build walks one server's changes into its timeline, with the
// time-averaged conversations and tokens per state.
func build(cs []change) timeline {
	tl := timeline{avg: map[string][2]float64{}}
	type held struct {
		state  string
		tokens int // own: beyond the shared prefix
		c      change
	}
	cur := map[string]held{}
	count, tokens := map[string]int{}, map[string]int{}
	sharing := map[string]int{} // held conversations per shared prefix
	total := 0
	prev := cs[0].at
	for _, c := range cs {
		dt := c.at - prev
		for _, s := range []string{"queued", "running", "idle", "shared"} {
			a := tl.avg[s]
			tl.avg[s] = [2]float64{a[0] + float64(count[s])*dt, a[1] + float64(tokens[s])*dt}
		}
		tl.span += dt
		prev = c.at
		if h, ok := cur[c.conv]; ok {
			total -= h.tokens
			count[h.state]--
			tokens[h.state] -= h.tokens
			delete(cur, c.conv)
			if sharing[h.c.key]--; sharing[h.c.key] == 0 {
				total -= h.c.shared
				tokens["shared"] -= h.c.shared
				count["shared"]--
			}
		}
		if c.state != "gone" {
			own := c.tokens - c.shared
			cur[c.conv] = held{c.state, own, c}
			total += own
			count[c.state]++
			tokens[c.state] += own
			if sharing[c.key]++; sharing[c.key] == 1 {
				total += c.shared
				tokens["shared"] += c.shared
				count["shared"]++
			}
		}
		tl.at, tl.held = append(tl.at, c.at), append(tl.held, total)
	}
	return tl
}

// peak is the most context held between from and to.
func (tl timeline) peak(from, to float64) int {
	i := sort.SearchFloat64s(tl.at, from)
	p := 0
	for ; i < len(tl.at) && tl.at[i] <= to; i++ {
		p = max(p, tl.held[i])
	}
	return p
}

// heldVersusMiss prints each server's time-averaged held conversations,
// and the later turns' misses by the most context their server held
// between their previous answer and their admission, against the pool.
func heldVersusMiss(w io.Writer, recs []record, pool int) {
	byServer := map[string][]record{}
	for _, r := range recs {
		byServer[r.Server] = append(byServer[r.Server], r)
	}
	servers := make([]string, 0, len(byServer))
	for s := range byServer {
		servers = append(servers, s)
	}
	sort.Strings(servers)
	type bin struct{ turns, short, missed, expected int }
	bins := map[int]*bin{}
	fmt.Fprintf(w, "held conversations per server, time-averaged (conversations / k tokens of own context; shared: prefixes / k tokens, once each), pool %dk:\n", pool/1000)
	for _, s := range servers {
		tl := build(changes(byServer[s]))
		if tl.span == 0 {
			continue
		}
		fmt.Fprintf(w, "  %s", s)
		sum := 0.0
		for _, st := range []string{"running", "queued", "idle", "shared"} {
			a := tl.avg[st]
			fmt.Fprintf(w, "  %s %.1f / %.0fk", st, a[0]/tl.span, a[1]/tl.span/1000)
			sum += a[1] / tl.span
		}
		fmt.Fprintf(w, "  held %.0fk (%.2f of the pool)\n", sum/1000, sum/float64(pool))
		for _, r := range byServer[s] {
			if !r.later() || r.AnswerAt < 0 || r.Expected == 0 {
				continue
			}
			k := min(10*tl.peak(r.AnswerAt, r.At)/pool, 30)
			if bins[k] == nil {
				bins[k] = &bin{}
			}
			b := bins[k]
			b.turns++
			b.missed += r.missed()
			b.expected += r.Expected
			if r.missed() > r.Expected/10 {
				b.short++
			}
		}
	}
	keys := make([]int, 0, len(bins))
	for k := range bins {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	fmt.Fprintln(w, "later turns by the peak context their server held between their previous answer and their admission:")
	fmt.Fprintf(w, "  %-12s %7s %16s %18s\n", "held/pool", "turns", "short by >10%", "missed of ideal")
	for _, k := range keys {
		b := bins[k]
		fmt.Fprintf(w, "  %4.1f-%-7.1f %7d %15.1f%% %17.1f%%\n", float64(k)/10, float64(k+1)/10, b.turns, pct(b.short, b.turns), pct(b.missed, b.expected))
	}
}
