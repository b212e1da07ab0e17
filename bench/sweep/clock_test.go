package main

import (
	"testing"
	"time"
)

func TestClockWatch(t *testing.T) {
	t0 := time.Unix(1000, 0)
	type obs struct {
		at    time.Duration // real time since t0
		clock float64
		ok    bool
	}
	tests := []struct {
		name     string
		obs      []obs
		elapsed  float64
		restarts int
	}{
		{"clock advances", []obs{{0, 5, true}, {time.Second, 15, true}, {2 * time.Second, 25, true}}, 20, 0},
		{"a failed scrape of a live server counts once", []obs{{0, 5, true}, {time.Second, 0, false}, {2 * time.Second, 25, true}}, 20, 0},
		// The new incarnation's clock (2 s: its loading) passed within the
		// 4 s since the last good scrape: it is not counted again.
		{"a server down 3 s then restarted", []obs{{0, 5, true}, {time.Second, 0, false}, {3 * time.Second, 0, false}, {4 * time.Second, 2, true}, {5 * time.Second, 12, true}}, 40 + 10, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newClockWatch([]string{"x"}, 10)
			for _, o := range tc.obs {
				c.observe(0, o.clock, counters{}, o.ok, t0.Add(o.at))
			}
			if got := c.simSeconds(); got != tc.elapsed || c.restarts() != tc.restarts {
				t.Errorf("elapsed %v, %d restarts; want %v, %d", got, c.restarts(), tc.elapsed, tc.restarts)
			}
		})
	}
}
