package dispatch

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestDelay(t *testing.T) {
	const s = time.Second
	tests := []struct {
		attempt  int
		base     time.Duration
		maxDelay time.Duration
		u        float64
		want     time.Duration
	}{
		{attempt: 1, base: 2 * s, maxDelay: 300 * s, u: 0.75, want: 1500 * time.Millisecond},
		{attempt: 1, base: 2 * s, maxDelay: 300 * s, u: 0.5, want: s},
		{attempt: 2, base: 2 * s, maxDelay: 300 * s, u: 0.5, want: 2 * s},
		{attempt: 3, base: 2 * s, maxDelay: 300 * s, u: 0.5, want: 4 * s},
		{attempt: 8, base: 2 * s, maxDelay: 300 * s, u: 0.5, want: 128 * s},
		{attempt: 9, base: 2 * s, maxDelay: 300 * s, u: 0.5, want: 150 * s}, // 512 s capped at 300
		{attempt: 1000, base: 2 * s, maxDelay: 300 * s, u: 1, want: 300 * s},
		{attempt: 5, base: 2 * s, maxDelay: 300 * s, u: 0, want: 0},
		{attempt: 0, base: 2 * s, maxDelay: 300 * s, u: 0.5, want: s}, // treated as the first attempt
		{attempt: 3, base: 0, maxDelay: 300 * s, u: 0.5, want: 0},
		{attempt: 3, base: 2 * s, maxDelay: s, u: 0.5, want: s / 2}, // cap below base
		{attempt: 2, base: 2 * s, maxDelay: 300 * s, u: 7, want: 4 * s},
	}
	for _, tt := range tests {
		got := Delay(tt.attempt, tt.base, tt.maxDelay, tt.u)
		if got != tt.want {
			t.Errorf("Delay(%d, %v, %v, %v) = %v, want %v", tt.attempt, tt.base, tt.maxDelay, tt.u, got, tt.want)
		}
	}
}

func TestBreakerCooldown(t *testing.T) {
	tests := []struct {
		n     int
		first time.Duration
		want  time.Duration
	}{
		{1, time.Second, time.Second},
		{2, time.Second, 2 * time.Second},
		{5, time.Second, 16 * time.Second},
		{6, time.Second, 30 * time.Second},
		{100, time.Second, 30 * time.Second},
		{1, time.Minute, 30 * time.Second},
	}
	for _, tt := range tests {
		if got := breakerCooldown(tt.n, tt.first); got != tt.want {
			t.Errorf("breakerCooldown(%d, %v) = %v, want %v", tt.n, tt.first, got, tt.want)
		}
	}
}

func TestLimiter(t *testing.T) {
	type step struct {
		op       string // acquire, release, limit
		n        int
		wantOK   bool // for acquire
		wantFree int
	}
	tests := []struct {
		name  string
		limit int
		steps []step
	}{
		{"fill and empty", 2, []step{
			{op: "acquire", wantOK: true, wantFree: 1},
			{op: "acquire", wantOK: true, wantFree: 0},
			{op: "acquire", wantOK: false, wantFree: 0},
			{op: "release", wantFree: 1},
			{op: "acquire", wantOK: true, wantFree: 0},
		}},
		{"shrink below in use", 3, []step{
			{op: "acquire", wantOK: true, wantFree: 2},
			{op: "acquire", wantOK: true, wantFree: 1},
			{op: "limit", n: 1, wantFree: 0},
			{op: "release", wantFree: 0},
			{op: "acquire", wantOK: false, wantFree: 0},
			{op: "release", wantFree: 1},
			{op: "acquire", wantOK: true, wantFree: 0},
		}},
		{"grow", 1, []step{
			{op: "acquire", wantOK: true, wantFree: 0},
			{op: "limit", n: 3, wantFree: 2},
			{op: "acquire", wantOK: true, wantFree: 1},
		}},
		{"zero and negative", 0, []step{
			{op: "acquire", wantOK: false, wantFree: 0},
			{op: "limit", n: -4, wantFree: 0},
			{op: "release", wantFree: 0}, // a stray release never makes room
			{op: "limit", n: 1, wantFree: 1},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewLimiter(tt.limit)
			for i, s := range tt.steps {
				switch s.op {
				case "acquire":
					if got := l.TryAcquire(); got != s.wantOK {
						t.Errorf("step %d: TryAcquire = %v, want %v", i, got, s.wantOK)
					}
				case "release":
					l.Release()
				case "limit":
					l.SetLimit(s.n)
				}
				if got := l.Free(); got != s.wantFree {
					t.Errorf("step %d (%s): Free = %d, want %d", i, s.op, got, s.wantFree)
				}
			}
		})
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	st := newFakeStore()
	eps, _ := fleet(newTracker(), ok(time.Second), "http://a")
	tests := []struct {
		name   string
		modify func(*Config)
		want   string
	}{
		{"no store", func(c *Config) { c.Store = nil }, "no store"},
		{"no owner", func(c *Config) { c.Owner = "" }, "no owner"},
		{"no lanes", func(c *Config) { c.Lanes = nil }, "no lanes"},
		{"no endpoints", func(c *Config) { c.Endpoints = nil }, "no endpoints"},
		{"duplicate lane", func(c *Config) { c.Lanes = append(c.Lanes, c.Lanes[0]) }, `lane "short" listed twice`},
		{"zero concurrency", func(c *Config) { c.Lanes[0].Concurrency = 0 }, "concurrency 0"},
		{"unknown escalation", func(c *Config) { c.Lanes[0].EscalateTo = "huge" }, `unknown lane "huge"`},
		{"escalation loop", func(c *Config) {
			c.Lanes = []LaneConfig{{Name: "a", Concurrency: 1, EscalateTo: "b"}, {Name: "b", Concurrency: 1, EscalateTo: "a"}}
		}, "loops back"},
		{"self escalation", func(c *Config) { c.Lanes[0].EscalateTo = "short" }, "loops back"},
		{"duplicate endpoint", func(c *Config) { c.Endpoints = append(c.Endpoints, c.Endpoints[0]) }, "listed twice"},
		{"endpoint without client", func(c *Config) { c.Endpoints = []Endpoint{{URL: "http://x"}} }, "needs a URL and a client"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := baseConfig(st, eps)
			cfg.Lanes = append([]LaneConfig(nil), cfg.Lanes...)
			tt.modify(&cfg)
			_, err := New(cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestNewDefaults(t *testing.T) {
	eps, _ := fleet(newTracker(), ok(time.Second), "http://a")
	d := mustNew(t, Config{Store: newFakeStore(), Owner: "o", Lanes: []LaneConfig{{Name: "l", Concurrency: 1}}, Endpoints: eps})
	got := []any{d.cfg.MaxAttempts, d.cfg.BaseDelay, d.cfg.MaxDelay, d.cfg.Lease, d.cfg.DrainTimeout, d.cfg.BreakerCooldown}
	want := []any{5, 2 * time.Second, 5 * time.Minute, 2 * time.Minute, 30 * time.Second, time.Second}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	if err := d.SetLaneLimit("nope", 3); err == nil {
		t.Errorf("SetLaneLimit of an unknown lane: got nil error")
	}
}

func TestPickLeastOutstandingRoundRobin(t *testing.T) {
	eps, _ := fleet(newTracker(), ok(time.Second), "a", "b", "c")
	d := mustNew(t, baseConfig(newFakeStore(), eps))
	now := time.Unix(1000, 0)
	pick := func() string {
		e, _ := d.pickLocked(now, d.lanes[0], 1000, affinity{})
		if e == nil {
			return ""
		}
		e.inflight++
		return e.url
	}
	// All idle: round robin; then each pick goes to the least loaded.
	var got []string
	for range 6 {
		got = append(got, pick())
	}
	if diff := cmp.Diff([]string{"a", "b", "c", "a", "b", "c"}, got); diff != "" {
		t.Errorf("picks with equal load (-want +got):\n%s", diff)
	}
	d.epByURL["b"].inflight = 0
	if got := pick(); got != "b" {
		t.Errorf("pick with b least loaded = %q, want b", got)
	}
	d.epByURL["b"].paused = true
	d.epByURL["c"].openUntil = now.Add(time.Second)
	d.epByURL["a"].inflight = 50
	if got := pick(); got != "a" {
		t.Errorf("pick with b paused and c open = %q, want a", got)
	}
	// c's breaker turns half-open: exactly one probe goes through.
	later := now.Add(2 * time.Second)
	e, probe := d.pickLocked(later, d.lanes[0], 1000, affinity{})
	if e == nil || e.url != "c" || !probe {
		t.Fatalf("pick after cooldown = %v probe=%v, want c as probe", e, probe)
	}
	e.inflight++
	if e, _ := d.pickLocked(later, d.lanes[0], 1000, affinity{}); e == nil || e.url != "a" {
		t.Errorf("pick while c's probe is in flight = %v, want a", e)
	}
}

func TestRunTwice(t *testing.T) {
	st := newFakeStore()
	eps, _ := fleet(newTracker(), ok(time.Millisecond), "http://a")
	d := mustNew(t, baseConfig(st, eps))
	if err := d.Run(context.Background()); err != nil {
		t.Fatalf("Run on an empty store: %v", err)
	}
	if err := d.Run(context.Background()); err == nil {
		t.Errorf("second Run: got nil error")
	}
}
