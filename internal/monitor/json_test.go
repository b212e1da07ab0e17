package monitor

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestReportJSONRules: unknown times are null, durations come in
// nanoseconds and seconds, lists are never null, keys are snake_case.
func TestReportJSONRules(t *testing.T) {
	r := Report{Job: "j", State: Running, ETA: 90 * time.Second,
		Heartbeat: &HeartbeatInfo{PID: 1, Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Age: 1500 * time.Millisecond},
		Endpoints: []EndpointStatus{{URL: "http://x", State: Starting}}}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	check := func(what string, got, want any) {
		t.Helper()
		gb, _ := json.Marshal(got)
		wb, _ := json.Marshal(want)
		if string(gb) != string(wb) {
			t.Errorf("%s = %s, want %s", what, gb, wb)
		}
	}
	check("schema_version", doc["schema_version"], SchemaVersion)
	check("time", doc["time"], nil)
	check("eta_ns", doc["eta_ns"], 90e9)
	check("eta_seconds", doc["eta_seconds"], 90)
	hb := doc["heartbeat"].(map[string]any)
	check("heartbeat.started", hb["started"], nil)
	check("heartbeat.time", hb["time"], "2026-01-02T03:04:05Z")
	check("heartbeat.age_seconds", hb["age_seconds"], 1.5)
	ep := doc["endpoints"].([]any)[0].(map[string]any)
	check("endpoint since", ep["since"], nil)
	check("endpoint last_token_at", ep["last_token_at"], nil)
	check("endpoint evidence", ep["evidence"], []any{})
	for _, k := range []string{"evidence", "cells", "events", "last_errors"} {
		check(k, doc[k], []any{})
	}
	var walk func(string, any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if k != strings.ToLower(k) || strings.ContainsAny(k, " -") {
					t.Errorf("key %s.%s is not snake_case", path, k)
				}
				walk(path+"."+k, x)
			}
		case []any:
			for _, x := range v {
				walk(path+"[]", x)
			}
		}
	}
	walk("", doc)

	r.ETA = 0
	b, _ = json.Marshal(r)
	doc = nil
	_ = json.Unmarshal(b, &doc)
	check("eta_ns without an ETA", doc["eta_ns"], nil)
	check("eta_seconds without an ETA", doc["eta_seconds"], nil)
}

// TestETAOnlyWhileProgressing: nothing can progress while the job is
// down, stalled, restarting, stopped, failed or dead, so no ETA is given.
func TestETAOnlyWhileProgressing(t *testing.T) {
	recent := Rate{Window: time.Minute, SamplesPerSec: 2}
	for _, tc := range []struct {
		state     State
		remaining int
		rate      Rate
		want      time.Duration
		note      string
	}{
		{Running, 100, recent, 50 * time.Second, ""},
		{Running, 100, Rate{Window: 10 * time.Minute}, 0, "unknown: no sample finished in the last 10m0s"},
		{Done, 0, recent, 0, "done"},
		{Down, 100, recent, 0, "none while DOWN: nothing is progressing"},
		{Stalled, 100, recent, 0, "none while STALLED: nothing is progressing"},
		{Restarting, 100, recent, 0, "none while RESTARTING: nothing is progressing"},
		{Stopped, 100, recent, 0, "none while STOPPED: nothing is progressing"},
		{Dead, 100, recent, 0, "none while DEAD: nothing is progressing"},
	} {
		got, note := eta(tc.state, tc.remaining, tc.rate)
		if got != tc.want || note != tc.note {
			t.Errorf("eta(%s, %d, %+v) = %s %q, want %s %q", tc.state, tc.remaining, tc.rate, got, note, tc.want, tc.note)
		}
	}
}
