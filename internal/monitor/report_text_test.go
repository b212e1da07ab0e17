package monitor

import "testing"

// TestEventText: an event without a state (ingest, restart, ...) prints no
// stray space before its evidence (issue 21: "ingest job : 603 rows").
func TestEventText(t *testing.T) {
	tests := []struct {
		e    Event
		want string
	}{
		{Event{Kind: "ingest", Subject: "job", Evidence: "603 rows read"}, "ingest job: 603 rows read"},
		{Event{Kind: "endpoint_state", Subject: "http://h:1", State: "DOWN", Evidence: "exit code 137"}, "endpoint_state http://h:1 DOWN: exit code 137"},
		{Event{Kind: "job_state", Subject: "job", State: "DONE"}, "job_state job DONE"},
		{Event{Kind: "restart"}, "restart"},
	}
	for _, tt := range tests {
		if got := tt.e.Text(); got != tt.want {
			t.Errorf("Text() = %q, want %q", got, tt.want)
		}
	}
}
