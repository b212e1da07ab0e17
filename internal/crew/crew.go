// Package crew decides how the workers of one job share it.
//
// A store that is not shared (SQLite) has one runner at a time: it holds
// the store's runner lock (a flock the kernel drops when the process dies,
// however it dies) for its whole life, and a second runner refuses to start
// beside a live one; no heartbeat read can make taking over atomic, a lock
// can. A shared store (PostgreSQL) has any number of workers at once; each
// returns the leases of workers it finds gone, and at the end exactly one
// of them exports (under the export lock) while the others see that export
// in its heartbeat's mark and finish too. Leases returned this way spend no
// attempt. The live workers sending to each endpoint are counted from the
// heartbeats too (Sharers), for conversation admission's part of a pool.
package crew

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	neturl "net/url"
	"os"
	"time"

	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
)

// RunnerLock is the lock a single-runner store's runner holds for its
// life: checking that no runner is live and becoming the runner are one
// step, which reading the last heartbeat and deciding is not (two runners
// started together both read the dead runner's heartbeat and both ran).
const RunnerLock = "runner"

// ExportLock is the named lock the exporting worker holds.
const ExportLock = "export"

// Store is what the crew reads and changes in the job's store.
type Store interface {
	TryLock(ctx context.Context, name string) (unlock func() error, ok bool, err error)
	LastHeartbeat(ctx context.Context) (hb store.Heartbeat, ok bool, err error)
	Heartbeats(ctx context.Context) ([]store.Heartbeat, error)
	ReleaseOwner(ctx context.Context, owner string) (int, error)
	ExpireLeases(ctx context.Context, now time.Time) (int, error)
	Counts(ctx context.Context) ([]store.Count, error)
	IngestErrorCount(ctx context.Context) (int, error)
}

// Config describes this worker and its job.
type Config struct {
	Store Store
	// Job names the job in messages; LockFile is where the runner lock
	// lives, as the messages show it (relative to the job file).
	Job, LockFile string
	// Owner, Host and Started are this worker's heartbeat identity.
	Owner, Host string
	Started     time.Time
	// Shared: several workers may run the job at once.
	Shared    bool
	DeadAfter time.Duration
	Logger    *slog.Logger
	// Event records what the crew did (leases taken back from a worker).
	Event func(context.Context, store.Event)
}

// Crew is this worker's place among the job's workers.
type Crew struct {
	cfg Config
	// rescued remembers the heartbeat time at which a gone worker's leases
	// were released, so they are released once per death.
	rescued map[string]time.Time
	// disown releases the runner lock of a single-runner store (nil until
	// taken; see own).
	disown func() error
}

// New returns the crew membership cfg describes.
func New(cfg Config) *Crew {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Event == nil {
		cfg.Event = func(context.Context, store.Event) {}
	}
	return &Crew{cfg: cfg, rescued: map[string]time.Time{}}
}

// Join prepares this worker's start: on a single-runner store it refuses
// to run beside a live runner and releases a dead one's leases; on a
// shared store it releases the leases of every gone worker. Expired leases
// go back to pending either way. Join may be called again after an error.
func (c *Crew) Join(ctx context.Context) error {
	if c.cfg.Shared {
		if _, err := c.rescue(ctx, true); err != nil {
			return err
		}
	} else {
		if err := c.own(ctx); err != nil {
			return err
		}
		hb, ok, err := c.cfg.Store.LastHeartbeat(ctx)
		if err != nil {
			return fmt.Errorf("read heartbeat: %w", err)
		}
		if ok {
			if err := c.takeOverFrom(ctx, hb); err != nil {
				return err
			}
		}
	}
	if _, err := c.cfg.Store.ExpireLeases(ctx, time.Now()); err != nil {
		return fmt.Errorf("expire leases: %w", err)
	}
	return nil
}

// Leave gives up the runner lock once the run is over.
func (c *Crew) Leave() {
	if c.disown == nil {
		return
	}
	if err := c.disown(); err != nil {
		c.cfg.Logger.Warn("release runner lock", "err", err)
	}
	c.disown = nil
}

// own takes the runner lock, or says who holds it.
func (c *Crew) own(ctx context.Context) error {
	if c.disown != nil {
		return nil // taken on an earlier try
	}
	unlock, ok, err := c.cfg.Store.TryLock(ctx, RunnerLock)
	if err != nil {
		return fmt.Errorf("take job %s: %w", c.cfg.Job, err)
	}
	if ok {
		c.disown = unlock
		return nil
	}
	// The holder may not have written its first heartbeat yet.
	if hb, ok, err := c.cfg.Store.LastHeartbeat(ctx); err == nil && ok && hb.Host == c.cfg.Host && monitor.RegenAlive(hb.PID) {
		return c.runBy(hb)
	}
	return fmt.Errorf("job %s is being run by another regen process (it holds the job's runner lock in %s.locks); stop that process first",
		c.cfg.Job, c.cfg.LockFile)
}

// runBy is the refusal to run beside the live runner of heartbeat hb.
func (c *Crew) runBy(hb store.Heartbeat) error {
	if hb.Host == c.cfg.Host {
		return fmt.Errorf("job %s is being run by pid %d on this machine (heartbeat %s ago); stop that process first",
			c.cfg.Job, hb.PID, time.Since(hb.Time).Round(time.Second))
	}
	return fmt.Errorf("job %s is being run by pid %d on %s (heartbeat %s ago); stop it first or wait until its heartbeat is %s old",
		c.cfg.Job, hb.PID, hb.Host, time.Since(hb.Time).Round(time.Second), c.cfg.DeadAfter)
}

func (c *Crew) takeOverFrom(ctx context.Context, hb store.Heartbeat) error {
	var beat monitor.Beat
	_ = json.Unmarshal(hb.Counters, &beat)
	// On this host the runner lock decides: its holder is the live runner,
	// and this runner holds it now (a pid in the heartbeat may have been
	// reused). Elsewhere (a store on a shared disk) only a fresh heartbeat
	// proves life.
	alive := hb.Host != c.cfg.Host && time.Since(hb.Time) < c.cfg.DeadAfter
	if alive && !beat.Exited && hb.PID != os.Getpid() {
		return c.runBy(hb)
	}
	n, err := c.cfg.Store.ReleaseOwner(ctx, hb.Owner)
	if err != nil {
		return fmt.Errorf("release leases of previous runner: %w", err)
	}
	if n > 0 {
		c.cfg.Event(ctx, store.Event{Kind: "takeover", Subject: "job",
			Evidence: fmt.Sprintf("released %d samples leased by previous runner pid %d (no attempts spent)", n, hb.PID)})
	}
	return nil
}

// RescueDead returns the leases of workers that are gone to pending, at
// once rather than when their leases expire, and says how many. A worker
// is gone when it exited, when it ran on this host and its process is
// gone, or when its heartbeat is older than dead_after, on this host too:
// a process that is frozen (SIGSTOP, a stalled VM) holds samples no one
// generates, and the store's fencing tokens refuse its answers if it
// wakes. The last rule is trusted only once this worker has itself been
// reaching the store (reachingFor) for at least dead_after: after an
// outage everyone's heartbeat is stale.
func (c *Crew) RescueDead(ctx context.Context, reachingFor time.Duration) (int, error) {
	return c.rescue(ctx, reachingFor >= c.cfg.DeadAfter)
}

func (c *Crew) rescue(ctx context.Context, trustAge bool) (int, error) {
	now := time.Now()
	hbs, err := c.cfg.Store.Heartbeats(ctx)
	if err != nil {
		return 0, fmt.Errorf("read heartbeats: %w", err)
	}
	released := 0
	for _, hb := range hbs {
		if hb.Owner == c.cfg.Owner {
			continue
		}
		if t, ok := c.rescued[hb.Owner]; ok && t.Equal(hb.Time) {
			continue // released already, and it has not beaten since
		}
		if !monitor.WorkerGone(hb, c.cfg.Host, now, c.cfg.DeadAfter, trustAge) {
			continue
		}
		n, err := c.cfg.Store.ReleaseOwner(ctx, hb.Owner)
		if err != nil {
			return released, fmt.Errorf("release leases of worker %s: %w", hb.Owner, err)
		}
		c.rescued[hb.Owner] = hb.Time
		if n > 0 {
			released += n
			c.cfg.Event(ctx, store.Event{Kind: "takeover", Subject: "job",
				Evidence: fmt.Sprintf("released %d samples leased by worker pid %d on %s, gone since its heartbeat %s ago (no attempts spent)",
					n, hb.PID, hb.Host, now.Sub(hb.Time).Round(time.Second))})
		}
	}
	return released, nil
}

// LiveOthers lists the other workers running the job now ("pid P on
// host"): a new configuration generation waits for them to stop, or they
// would go on storing answers of the old configuration.
func (c *Crew) LiveOthers(ctx context.Context) ([]string, error) {
	hbs, err := c.cfg.Store.Heartbeats(ctx)
	if err != nil {
		return nil, fmt.Errorf("read heartbeats: %w", err)
	}
	var live []string
	for _, hb := range hbs {
		if hb.Owner == c.cfg.Owner || monitor.WorkerGone(hb, c.cfg.Host, time.Now(), c.cfg.DeadAfter, true) {
			continue
		}
		live = append(live, fmt.Sprintf("pid %d on %s", hb.PID, hb.Host))
	}
	return live, nil
}

// Sharers counts, for each of urls, the live workers of the job that send
// to it, this one included: conversation admission holds each worker to
// its part of a server's KV pool (dispatch.SetSharers). A worker sends to
// the endpoints its heartbeat lists, or, while it has listed none yet
// (starting), to the job's endpoints, which are this worker's too. A
// loopback URL names a different server on another host, so there it
// counts only workers on this host. A worker that is gone
// (monitor.WorkerGone) stops counting. A store that is not shared has this
// worker alone (nil).
func (c *Crew) Sharers(ctx context.Context, urls []string) (map[string]int, error) {
	if !c.cfg.Shared {
		return nil, nil
	}
	hbs, err := c.cfg.Store.Heartbeats(ctx)
	if err != nil {
		return nil, fmt.Errorf("read heartbeats: %w", err)
	}
	out := make(map[string]int, len(urls))
	for _, u := range urls {
		out[u] = 1
	}
	now := time.Now()
	for _, hb := range hbs {
		if hb.Owner == c.cfg.Owner || monitor.WorkerGone(hb, c.cfg.Host, now, c.cfg.DeadAfter, true) {
			continue
		}
		var b monitor.Beat
		_ = json.Unmarshal(hb.Counters, &b)
		for _, u := range urls {
			if sendsTo(b, u) && (hb.Host == c.cfg.Host || !loopback(u)) {
				out[u]++
			}
		}
	}
	return out, nil
}

// sendsTo reports whether the worker of beat b sends to url.
func sendsTo(b monitor.Beat, url string) bool {
	if len(b.Endpoints) == 0 {
		return true
	}
	for _, e := range b.Endpoints {
		if e.URL == url {
			return true
		}
	}
	return false
}

// loopback reports whether raw names a server on the host that uses it.
func loopback(raw string) bool {
	u, err := neturl.Parse(raw)
	if err != nil {
		return false
	}
	if h := u.Hostname(); h == "localhost" {
		return true
	} else if ip := net.ParseIP(h); ip != nil {
		return ip.IsLoopback()
	}
	return false
}

// ExportMark identifies the finished samples an export holds: the same
// counts mean the same export (a requeue changes them).
func (c *Crew) ExportMark(ctx context.Context) (string, error) {
	counts, err := c.cfg.Store.Counts(ctx)
	if err != nil {
		return "", fmt.Errorf("read counts: %w", err)
	}
	bad, err := c.cfg.Store.IngestErrorCount(ctx)
	if err != nil {
		return "", fmt.Errorf("count ingest errors: %w", err)
	}
	_, t := monitor.Cells(counts)
	return fmt.Sprintf("%d done, %d rejected, %d dead, %d bad rows", t.Done, t.Rejected, t.Dead, bad), nil
}

// ExportedByOther reports whether another worker wrote (or found) an
// export of mark while this one was running. An export by an earlier run
// does not count: a re-run writes the files again, in case they were
// moved away. Only a shared store has other workers.
func (c *Crew) ExportedByOther(ctx context.Context, mark string) (bool, error) {
	if !c.cfg.Shared {
		return false, nil
	}
	hbs, err := c.cfg.Store.Heartbeats(ctx)
	if err != nil {
		return false, fmt.Errorf("read heartbeats: %w", err)
	}
	for _, hb := range hbs {
		var b monitor.Beat
		if hb.Owner != c.cfg.Owner && !hb.Time.Before(c.cfg.Started) && json.Unmarshal(hb.Counters, &b) == nil && b.Exported == mark {
			return true, nil
		}
	}
	return false, nil
}
