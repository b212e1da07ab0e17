package runner

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"
)

// A server we did not launch that hangs while its /health stays 200 is
// STALLED after monitor.hang_after, and each repeat waits twice as long
// before dispatch tries it again, instead of flapping at every probe.
func TestProbedEndpointHangBacksOff(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			return // health and metrics answer 200: the front end looks fine
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select { // a wedged engine: headers, then nothing
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release)
	dir := t.TempDir()
	writePrompts(t, filepath.Join(dir, "prompts.jsonl"), 20)
	spec := loadJobYAML(t, dir, fmt.Sprintf(`name: hang
model: m
endpoints: [{url: %q}]
sources: [{partition: p, path: prompts.jsonl, prompt: prompt, id: id}]
lanes: [{name: default, concurrency: 4, max_tokens: 64}]
monitor: {heartbeat_every: 100ms, hang_after: 400ms}
`, srv.URL))
	st := openStore(t, spec)
	r := startRun(t, spec, st, true)
	nextTry := regexp.MustCompile(`next try in ([0-9.]+m?s)`)
	var cooldowns []string
	waitFor(t, r, 60*time.Second, "three STALLED events", func() bool {
		cooldowns = cooldowns[:0]
		for _, e := range events(t, st) {
			if e.Kind == "endpoint_state" && e.State == "STALLED" {
				if m := nextTry.FindStringSubmatch(e.Evidence); m != nil {
					cooldowns = append(cooldowns, m[1])
				}
			}
		}
		return len(cooldowns) >= 3
	})

	if want := []string{"400ms", "800ms", "1.6s"}; !slices.Equal(cooldowns[:3], want) {
		t.Errorf("cooldowns after successive stalls = %v, want %v", cooldowns, want)
	}
}
