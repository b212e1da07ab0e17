package sim

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"
)

// missDiag explains, for every later turn of a conversation (the messages
// end with an assistant answer and a new user message), why its prompt
// was not all cached but its last question: it remembers when each prefix
// node was inserted and evicted and which answer each prompt was cached
// with, and writes one JSON line per later turn at its admission. It is
// a measuring aid, off by default (Config.MissLog); nothing reads it back.
type missDiag struct {
	server   string
	path     string
	mu       *sync.Mutex // shared by every server writing the same file
	out      *os.File
	inserted map[uint64]time.Duration // node hash -> simulated time it last joined the cache
	evicted  map[uint64]evictNote     // node hash -> its last eviction
	answerOf map[uint64]answerNote    // a prompt's last prefix hash -> the answer cached after it
}

type evictNote struct {
	at                         time.Duration
	used, evictable, pool      int
	running, waiting, reserved int
	need                       int
}

type answerNote struct {
	hash uint64
	text []byte // the answer's content as keyed (a JSON string)
	at   time.Duration
}

var missLogs = struct {
	sync.Mutex
	files map[string]*os.File
	locks map[string]*sync.Mutex
	users map[string]int
}{files: map[string]*os.File{}, locks: map[string]*sync.Mutex{}, users: map[string]int{}}

// newMissDiag opens path for appending (once per process, shared by the
// servers that name it), or returns nil when path is empty.
func newMissDiag(path, server string) (*missDiag, error) {
	if path == "" {
		return nil, nil
	}
	missLogs.Lock()
	defer missLogs.Unlock()
	f, ok := missLogs.files[path]
	if !ok {
		var err error
		f, err = os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return nil, fmt.Errorf("open miss log: %w", err)
		}
		missLogs.files[path] = f
		missLogs.locks[path] = &sync.Mutex{}
	}
	missLogs.users[path]++
	return &missDiag{server: server, path: path, mu: missLogs.locks[path], out: f, inserted: map[uint64]time.Duration{},
		evicted: map[uint64]evictNote{}, answerOf: map[uint64]answerNote{}}, nil
}

// missRecord is one later turn at its first admission. Tokens are the
// simulator's estimates, as cached_tokens are.
// Why a request waited at the head of the queue (request.blocked).
const (
	blockPool    = "pool"
	blockReserve = "reserve"
	blockBudget  = "budget"
)

type missRecord struct {
	Server     string  `json:"server"`
	At         float64 `json:"at"`       // simulated seconds at admission
	Queued     float64 `json:"queued"`   // seconds it waited in this server's queue
	Prompt     int     `json:"prompt"`   // prompt tokens
	Hit        int     `json:"hit"`      // cached tokens found
	Expected   int     `json:"expected"` // the previous prompt + its answer
	PrevPrompt int     `json:"prev_prompt"`
	Depth      int     `json:"depth"` // prefix segments matched, of Segs
	Segs       int     `json:"segs"`
	// Cause of a shortfall (Hit < Expected): answer_evicted, prompt_evicted
	// (a node of the previous prompt is gone too), answer_key (the previous
	// prompt was answered here under another key), answer_never (the
	// previous prompt was placed here but no answer was cached after it),
	// prompt_unseen (the previous prompt never reached this server),
	// none otherwise; "first" marks a first turn's admission and "done" a
	// turn's end (Output then is what it generated), for the timeline.
	Cause      string  `json:"cause"`
	Missing    int     `json:"missing"`     // the first unmatched segment's index
	EvictedAt  float64 `json:"evicted_at"`  // its eviction, simulated seconds (-1: none)
	InsertedAt float64 `json:"inserted_at"` // when it last joined the cache (-1: never)
	Arrived    float64 `json:"arrived"`     // this request's arrival at the queue
	AnswerAt   float64 `json:"answer_at"`   // when the previous answer was cached here (-1: never)
	Conv       string  `json:"conv"`        // the conversation: its first message after the system prompt
	Output     int     `json:"output"`      // tokens this turn will generate
	Shared     int     `json:"shared"`      // its first segment's tokens (the system prompt)
	SharedKey  string  `json:"shared_key"`  // and its hash
	// Blocked is why admission last stopped at it: pool (its uncached
	// prompt did not fit), reserve (it fit, not with the running requests'
	// reserved output), budget (the prefill batch was full), behind (it
	// never reached the head), "" when it did not wait.
	Blocked      string     `json:"blocked,omitempty"`
	Pool         *evictPool `json:"pool,omitempty"`
	SentAnswer   string     `json:"sent_answer,omitempty"` // on answer_key: the first bytes that differ
	CachedAnswer string     `json:"cached_answer,omitempty"`
}

type evictPool struct {
	Used      int `json:"used"`
	Evictable int `json:"evictable"`
	Pool      int `json:"pool"`
	Running   int `json:"running"`
	Waiting   int `json:"waiting"`
	Reserved  int `json:"reserved"` // tokens reserved for the running requests' outputs
	Need      int `json:"need"`     // free tokens the eviction was asked for
}

func simSeconds(d time.Duration) float64 { return d.Seconds() }

// noteEvict records n's eviction with the pool as it stood.
func (d *missDiag) noteEvict(sc *scheduler, hash uint64) {
	reserved := 0.0
	for _, r := range sc.running {
		reserved += float64(min(r.maxNew-r.gen, sc.cfg.ClipMaxNewTokens)) * sc.ratio
	}
	d.evicted[hash] = evictNote{at: sc.simNow, used: sc.used, evictable: sc.cache.evictable, pool: sc.pool,
		running: len(sc.running), waiting: len(sc.waiting), reserved: int(reserved), need: sc.evictNeed}
}

// noteAnswer records the answer cached after a prompt's last prefix.
func (d *missDiag) noteAnswer(sc *scheduler, prompt, answer uint64, text []byte) {
	d.answerOf[prompt] = answerNote{hash: answer, text: text, at: sc.simNow}
}

// record writes r's line at its first admission; hit is what it found.
// A first turn gets a short line (cause "first"), for the timeline.
func (d *missDiag) record(sc *scheduler, r *request, hit int) {
	n := len(r.prefixes)
	if r.kind != kindChat || n < 2 {
		return
	}
	if !r.laterTurn || n < 3 {
		d.write(r, missRecord{Server: d.server, At: simSeconds(sc.simNow), Queued: simSeconds(sc.simNow - r.queuedSim),
			Arrived: simSeconds(r.queuedSim), Prompt: r.prompt, Hit: hit, Cause: "first", Missing: -1, EvictedAt: -1,
			InsertedAt: -1, AnswerAt: -1, Output: r.plan.target})
		return
	}
	ans, prev := r.prefixes[n-2], r.prefixes[n-3]
	depth := 0
	for _, s := range r.prefixes {
		if _, ok := sc.cache.nodes[s.hash]; !ok {
			break
		}
		depth++
	}
	rec := missRecord{Server: d.server, At: simSeconds(sc.simNow), Queued: simSeconds(sc.simNow - r.queuedSim),
		Arrived: simSeconds(r.queuedSim), Prompt: r.prompt, Hit: hit, Expected: ans.tokens, PrevPrompt: prev.tokens,
		Depth: depth, Segs: n, Cause: "none", Missing: -1, EvictedAt: -1, InsertedAt: -1, AnswerAt: -1,
		Output: r.plan.target}
	if a, ok := d.answerOf[prev.hash]; ok {
		rec.AnswerAt = simSeconds(a.at)
	}
	rec.Blocked = r.blocked
	if rec.Blocked == "" && sc.simNow > r.queuedSim {
		rec.Blocked = "behind"
	}
	if hit < ans.tokens {
		rec.Missing = depth
		miss := r.prefixes[depth].hash
		rec.Cause = d.cause(r, depth, n)
		if at, ok := d.inserted[miss]; ok {
			rec.InsertedAt = simSeconds(at)
		}
		if e, ok := d.evicted[miss]; ok {
			rec.EvictedAt = simSeconds(e.at)
			rec.Pool = &evictPool{Used: e.used, Evictable: e.evictable, Pool: e.pool, Running: e.running,
				Waiting: e.waiting, Reserved: e.reserved, Need: e.need}
		}
		if rec.Cause == "answer_key" {
			rec.SentAnswer, rec.CachedAnswer = firstDiff(r.sentAnswer, d.answerOf[prev.hash].text)
		}
	}
	d.write(r, rec)
}

// finished writes a short line (cause "done") when a chat turn ends.
func (d *missDiag) finished(sc *scheduler, r *request) {
	if r.kind == kindChat && len(r.prefixes) >= 2 && r.admitted {
		d.write(r, missRecord{Server: d.server, At: simSeconds(sc.simNow), Prompt: r.prompt, Cause: "done", Missing: -1,
			EvictedAt: -1, InsertedAt: -1, AnswerAt: -1, Output: r.emitted})
	}
}

// write writes rec for r, naming r's conversation (its first message
// after the shared one) and its shared first segment (the system prompt).
func (d *missDiag) write(r *request, rec missRecord) {
	rec.Conv = fmt.Sprintf("%x", r.prefixes[1].hash)
	rec.Shared, rec.SharedKey = r.prefixes[0].tokens, fmt.Sprintf("%x", r.prefixes[0].hash)
	line, _ := json.Marshal(rec) // plain fields always encode
	d.mu.Lock()
	d.out.Write(append(line, '\n'))
	d.mu.Unlock()
}

// cause names why the segment at depth (the first not cached) is missing.
func (d *missDiag) cause(r *request, depth, n int) string {
	miss := r.prefixes[depth].hash
	if depth < n-2 {
		if _, ok := d.inserted[miss]; ok {
			return "prompt_evicted"
		}
		return "prompt_unseen"
	}
	prev := r.prefixes[n-3].hash
	a, ok := d.answerOf[prev]
	switch {
	case !ok:
		return "answer_never"
	case a.hash != miss:
		return "answer_key"
	}
	if _, ok := d.evicted[miss]; ok {
		return "answer_evicted"
	}
	return "answer_gone"
}

// firstDiff returns both texts from 20 bytes before their first
// difference, 80 bytes at most each.
func firstDiff(a, b []byte) (string, string) {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	from := max(i-20, 0)
	cut := func(x []byte) string {
		return fmt.Sprintf("@%d/%d %q", i, len(x), x[min(from, len(x)):min(from+80, len(x))])
	}
	return cut(a), cut(b)
}

var missServers struct {
	sync.Mutex
	n int
}

// startMissDiag opens the miss log when Config.MissLog names one and
// hooks the prefix cache to it.
func (sc *scheduler) startMissDiag() error {
	missServers.Lock()
	missServers.n++
	name := fmt.Sprintf("s%d", missServers.n)
	missServers.Unlock()
	d, err := newMissDiag(sc.cfg.MissLog, name)
	if err != nil || d == nil {
		return err
	}
	sc.diag = d
	sc.cache.onInsert = func(h uint64) { d.inserted[h] = sc.simNow }
	sc.cache.onEvict = func(h uint64) { d.noteEvict(sc, h) }
	return nil
}

// close closes the log when its last server closes.
func (d *missDiag) close() error {
	missLogs.Lock()
	defer missLogs.Unlock()
	if missLogs.users[d.path]--; missLogs.users[d.path] > 0 {
		return nil
	}
	f := missLogs.files[d.path]
	delete(missLogs.files, d.path)
	delete(missLogs.locks, d.path)
	delete(missLogs.users, d.path)
	return f.Close()
}
