package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// With priority scheduling the queue is in priority order, arrival order
// within a priority: higher values first as SGLang by default, lower first
// with --schedule-low-priority-values-first or as vLLM. Without it the
// field changes nothing.
func TestPriorityOrdersTheQueue(t *testing.T) {
	arrivals := []int{0, 1, 0, -1, 1}
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string
	}{
		{"off", Config{}, []string{"r0", "r1", "r2", "r3", "r4"}},
		{"SGLang: higher first", Config{PriorityScheduling: true}, []string{"r1", "r4", "r0", "r2", "r3"}},
		{"SGLang, low values first", Config{PriorityScheduling: true, LowPriorityFirst: true}, []string{"r3", "r0", "r2", "r1", "r4"}},
		{"vLLM: lower first", Config{PriorityScheduling: true, Engine: EngineVLLM}, []string{"r3", "r0", "r2", "r1", "r4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := &scheduler{cfg: &tc.cfg}
			for i, p := range arrivals {
				sc.enqueue(&request{id: fmt.Sprintf("r%d", i), priority: p})
			}
			var got []string
			for _, r := range sc.waiting {
				got = append(got, r.id)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("queue (-want +got):\n%s", diff)
			}
		})
	}
}

// The server says whether it schedules by priority where SGLang does (its
// server arguments in /get_server_info); a vLLM server without priority
// scheduling refuses a priority other than 0, as vLLM does.
func TestPriorityServerInfoAndRefusal(t *testing.T) {
	c := testConfig()
	c.PriorityScheduling, c.LowPriorityFirst = true, true
	_, url, _ := startServer(t, c)
	resp, err := http.Get(url + "/get_server_info")
	if err != nil {
		t.Fatal(err)
	}
	var info map[string]any
	err = json.NewDecoder(resp.Body).Decode(&info)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if info["enable_priority_scheduling"] != true || info["schedule_low_priority_values_first"] != true {
		t.Errorf("server info priority fields %v, %v; want true, true", info["enable_priority_scheduling"], info["schedule_low_priority_values_first"])
	}

	v := testConfig()
	v.Engine = EngineVLLM
	_, vurl, _ := startServer(t, v)
	for _, tc := range []struct {
		priority int
		status   int
	}{{0, 200}, {-1, 400}} {
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"priority":%d}`, tc.priority)
		resp, err := http.Post(vurl+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			Message string `json:"message"`
		}
		json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("vLLM without priority scheduling, priority %d: status %d (%s), want %d", tc.priority, resp.StatusCode, out.Message, tc.status)
		}
		if tc.status == 400 && !strings.Contains(out.Message, "Priority scheduling is not enabled") {
			t.Errorf("refusal %q, want vLLM's message", out.Message)
		}
	}
}
