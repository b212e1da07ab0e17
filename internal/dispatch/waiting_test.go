package dispatch

import "testing"

// The controller's crowd-out rule reads, per lane, the requests sent to an
// endpoint that have not started streaming; shed and moved ones are on
// their way out and count for no lane.
func TestWaitingCountsRequestsNotStreaming(t *testing.T) {
	short, long := &lane{idx: 0}, &lane{idx: 1}
	e := &endpoint{calls: map[*call]struct{}{}}
	add := func(l *lane, streaming, shed, moved bool) {
		cl := &call{lane: l, shed: shed, moved: moved}
		cl.streaming.Store(streaming)
		e.calls[cl] = struct{}{}
	}
	for range 3 {
		add(short, false, false, false)
	}
	add(short, true, false, false)
	add(long, true, false, false)
	add(long, false, false, false)
	add(long, false, true, false)
	add(long, false, false, true)
	per, all := e.waitingLocked(2)
	if per[0] != 3 || per[1] != 1 || all != 4 {
		t.Errorf("waiting per lane %v, all %d; want [3 1], 4", per, all)
	}
}
