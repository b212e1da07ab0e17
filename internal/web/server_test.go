package web

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/regen-dev/regen/internal/dispatch"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// fixture is a job store with done, dead, rejected and pending samples,
// a heartbeat and a few minutes of history.
func fixture(t *testing.T) (store.Store, func(ctx context.Context) (monitor.Report, error)) {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "web.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var in []store.NewSample
	for i := range 120 {
		id := fmt.Sprintf("A/%03d", i)
		in = append(in, store.NewSample{ID: id, Partition: "A", Lane: "short", Origin: fmt.Sprintf("a.jsonl:%d", i+1),
			Body: []byte(`{"messages":[{"role":"user","content":"secret prompt ` + id + `"}]}`), PromptTokens: 5})
	}
	must(t, nil2(st.Ingest(ctx, in)))
	claimed, err := st.Claim(ctx, "short", 100, "w", time.Minute)
	must(t, err)
	for i, c := range claimed {
		switch {
		case i < 90:
			must(t, st.Complete(ctx, c.ID, "w", store.Result{Response: []byte(`{"content":"answer ` + c.ID + `","reasoning_content":"thought","usage":{"completion_tokens":7}}`),
				FinishReason: "stop", PromptTokens: 5, CompletionTokens: 7, Endpoint: "http://127.0.0.1:1", Duration: time.Second, TTFT: 100 * time.Millisecond}))
		case i < 95:
			must(t, st.DeadLetter(ctx, c.ID, "w", "400: context too long"))
		default:
			must(t, st.Reject(ctx, c.ID, "w", store.Result{Response: []byte(`{}`), FinishReason: "stop", Endpoint: "http://127.0.0.1:1"}, "empty", "empty answer"))
		}
	}
	// One two-turn conversation: its first answer is an earlier turn.
	must(t, nil2(st.Ingest(ctx, []store.NewSample{{ID: "M/001", Partition: "M", Lane: "chat", Origin: "m.jsonl:1",
		Body: []byte(`{"messages":[{"role":"user","content":"hello"}],"turns":[{"input":[{"role":"user","content":"and then?"}]}]}`)}})))
	turn0 := store.Result{Response: []byte(`{"content":"first answer"}`), FinishReason: "stop", PromptTokens: 3, CompletionTokens: 2, Endpoint: "http://127.0.0.1:1"}
	for turn, complete := range []func(id string) error{
		func(id string) error { return st.CompleteTurn(ctx, id, "w", turn0, "") },
		func(id string) error {
			return st.Complete(ctx, id, "w", store.Result{Turn: 1, Response: []byte(`{"content":"second answer"}`), FinishReason: "stop",
				PromptTokens: 9, CompletionTokens: 2, Endpoint: "http://127.0.0.1:1"})
		},
	} {
		c, err := st.Claim(ctx, "chat", 1, "w", time.Minute)
		if err != nil || len(c) != 1 || c[0].Turn != turn {
			t.Fatalf("claim turn %d of M/001: %+v %v", turn, c, err)
		}
		must(t, complete(c[0].ID))
	}
	beat, _ := json.Marshal(monitor.Beat{State: monitor.Running, Endpoints: []monitor.EndpointStatus{{URL: "http://127.0.0.1:1", State: monitor.Ready,
		InFlight: 3, Load: &monitor.Load{KVUsage: ptr(0.42), Queued: ptr(2), Running: ptr(3)}}}})
	now := time.Now()
	must(t, st.PutHeartbeat(ctx, store.Heartbeat{Owner: "w", PID: 1, Host: "elsewhere", Time: now, Started: now.Add(-2 * time.Hour), Counters: beat}))
	must(t, st.AddEvent(ctx, store.Event{Kind: "endpoint_state", Subject: "http://127.0.0.1:1", State: "DOWN", Evidence: "exit code 137"}))
	must(t, st.AddIngestErrors(ctx, []store.IngestError{{Partition: "A", Origin: "a.jsonl:999", Reason: "not JSON"}}))
	minute := now.Truncate(time.Minute)
	must(t, st.PutMinutes(ctx, []store.Minute{
		{Time: minute.Add(-time.Minute), Worker: "w", Tokens: 600, Requests: 60, Samples: 50, KVUsage: -1, Queued: -1, Running: -1},
		{Time: minute.Add(-time.Minute), Worker: "w", Endpoint: "http://127.0.0.1:1", Tokens: 600, Requests: 60, KVUsage: 0.4, Queued: 1, Running: 3},
	}))
	report := func(ctx context.Context) (monitor.Report, error) {
		return monitor.Assess(ctx, st, monitor.AssessOptions{Job: "webtest", Now: time.Now(), DeadAfter: time.Hour})
	}
	return st, report
}

func nil2(_ int, err error) error { return err }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func newServer(t *testing.T, token string) *httptest.Server {
	t.Helper()
	st, report := fixture(t)
	s, err := New(Options{Store: st, Report: report, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, c *http.Client, req *http.Request) (int, string) {
	t.Helper()
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func request(t *testing.T, method, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TestTokenOnEveryRequest: with a token (as a non-loopback bind requires),
// every path answers 401 without it and 200 with it, by header, by the
// cookie a ?token= visit sets, never by a wrong one.
func TestTokenOnEveryRequest(t *testing.T) {
	const token = "s3cret-token"
	srv := newServer(t, token)
	paths := []string{"/", "/assets/app.js", "/api/status", "/api/history", "/api/events", "/api/samples", "/api/samples/A/001", "/api/ingest-errors", "/metrics"}
	for _, p := range paths {
		if code, _ := get(t, nil, request(t, "GET", srv.URL+p)); code != http.StatusUnauthorized {
			t.Errorf("GET %s without token: %d, want 401", p, code)
		}
		req := request(t, "GET", srv.URL+p)
		req.Header.Set("Authorization", "Bearer wrong-token")
		if code, _ := get(t, nil, req); code != http.StatusUnauthorized {
			t.Errorf("GET %s with a wrong token: %d, want 401", p, code)
		}
		req = request(t, "GET", srv.URL+p)
		req.Header.Set("Authorization", "Bearer "+token)
		if code, body := get(t, nil, req); code != http.StatusOK {
			t.Errorf("GET %s with the token: %d, want 200\n%s", p, code, body)
		}
	}
	// A browser: ?token= once sets the cookie and redirects to the page
	// without the token; the cookie then opens everything.
	jar := newJar()
	c := &http.Client{Jar: jar}
	resp, err := c.Get(srv.URL + "/?token=" + token)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || strings.Contains(resp.Request.URL.String(), token) {
		t.Fatalf("GET /?token=: %d at %s, want 200 at a URL without the token", resp.StatusCode, resp.Request.URL)
	}
	if code, _ := get(t, c, request(t, "GET", srv.URL+"/api/status")); code != http.StatusOK {
		t.Errorf("GET /api/status with the cookie: %d, want 200", code)
	}
	if code, _ := get(t, nil, request(t, "GET", srv.URL+"/?token=nope")); code != http.StatusUnauthorized {
		t.Errorf("GET /?token=nope: %d, want 401", code)
	}
}

func TestCheckBind(t *testing.T) {
	for _, tc := range []struct {
		addr, token string
		ok          bool
	}{
		{"127.0.0.1:8080", "", true},
		{"localhost:8080", "", true},
		{"[::1]:8080", "", true},
		{"127.0.0.2:0", "", true},
		{":8080", "", false},
		{"0.0.0.0:8080", "", false},
		{"10.1.2.3:8080", "", false},
		{"gpu-box:8080", "", false},
		{"0.0.0.0:8080", "t", true},
		{"nonsense", "t", false},
	} {
		err := CheckBind(tc.addr, tc.token)
		if (err == nil) != tc.ok {
			t.Errorf("CheckBind(%q, token %q) = %v, want ok=%v", tc.addr, tc.token, err, tc.ok)
		}
	}
}

// TestReadOnlyAndLoopbackHost: nothing but GET/HEAD, and a token-less
// dashboard refuses a foreign Host (DNS rebinding).
func TestReadOnlyAndLoopbackHost(t *testing.T) {
	srv := newServer(t, "")
	for _, m := range []string{"POST", "PUT", "DELETE", "PATCH"} {
		if code, _ := get(t, nil, request(t, m, srv.URL+"/api/status")); code != http.StatusMethodNotAllowed {
			t.Errorf("%s /api/status: %d, want 405", m, code)
		}
	}
	req := request(t, "GET", srv.URL+"/api/status")
	req.Host = "evil.example:80"
	if code, _ := get(t, nil, req); code != http.StatusForbidden {
		t.Errorf("GET with Host evil.example: %d, want 403", code)
	}
	if code, _ := get(t, nil, request(t, "GET", srv.URL+"/api/status")); code != http.StatusOK {
		t.Errorf("GET /api/status on loopback: %d, want 200", code)
	}
}

// TestMetricsParse: /metrics is valid Prometheus text that expfmt parses,
// with the store's numbers and the runner's request metrics under regen_.
func TestMetricsParse(t *testing.T) {
	st, report := fixture(t)
	m := monitor.NewMetrics(report)
	m.ObserveRequest("short", "http://127.0.0.1:1", dispatch.OutcomeOK, 2*time.Second, 150*time.Millisecond, 40)
	m.ObserveRequest("short", "http://127.0.0.1:1", "server-down", 10*time.Millisecond, 0, 0)
	s, err := New(Options{Store: st, Report: report, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	code, body := get(t, nil, request(t, "GET", srv.URL+"/metrics"))
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d\n%s", code, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	// promtool (Debian's prometheus package) lints names, help and units
	// too; where it is installed its verdict counts as well.
	if promtool, err := exec.LookPath("promtool"); err == nil {
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = strings.NewReader(body)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool check metrics: %v\n%s", err, out)
		}
	} else {
		t.Log("promtool not installed; checked with expfmt only")
	}
	for name := range fams {
		if !strings.HasPrefix(name, "regen_") {
			t.Errorf("metric %s lacks the regen_ prefix", name)
		}
	}
	value := func(name string, labels map[string]string) float64 {
		t.Helper()
		fam := fams[name]
		if fam == nil {
			t.Fatalf("no metric %s in\n%s", name, body)
		}
	next:
		for _, mt := range fam.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue next
				}
			}
			switch {
			case mt.GetGauge() != nil:
				return mt.GetGauge().GetValue()
			case mt.GetCounter() != nil:
				return mt.GetCounter().GetValue()
			case mt.GetHistogram() != nil:
				return float64(mt.GetHistogram().GetSampleCount())
			}
		}
		t.Fatalf("no %s%v in\n%s", name, labels, body)
		return 0
	}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"regen_samples", map[string]string{"partition": "A", "lane": "short", "state": "done"}, 90},
		{"regen_samples", map[string]string{"partition": "A", "lane": "short", "state": "dead"}, 5},
		{"regen_samples", map[string]string{"partition": "A", "lane": "short", "state": "rejected"}, 5},
		{"regen_samples", map[string]string{"partition": "A", "lane": "short", "state": "pending"}, 20},
		{"regen_job_state", map[string]string{"state": "RUNNING"}, 1},
		{"regen_job_state", map[string]string{"state": "DOWN"}, 0},
		{"regen_endpoint_state", map[string]string{"endpoint": "http://127.0.0.1:1", "state": "READY"}, 1},
		{"regen_endpoint_kv_usage_ratio", map[string]string{"endpoint": "http://127.0.0.1:1"}, 0.42},
		{"regen_endpoint_queued_requests", map[string]string{"endpoint": "http://127.0.0.1:1"}, 2},
		{"regen_ingest_errors", nil, 1},
		{"regen_requests_total", map[string]string{"outcome": "ok"}, 1},
		{"regen_errors_total", map[string]string{"class": "server-down"}, 1},
		{"regen_tokens_generated_total", map[string]string{"lane": "short"}, 40},
		{"regen_request_duration_seconds", map[string]string{"lane": "short"}, 1},
		{"regen_ttft_seconds", map[string]string{"lane": "short"}, 1},
	} {
		if got := value(tc.name, tc.labels); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	if age := value("regen_heartbeat_age_seconds", nil); age < 0 || age > 60 {
		t.Errorf("regen_heartbeat_age_seconds = %v, want a fresh heartbeat", age)
	}
}

// TestAPI: the reads the pages make return the store's data, paged.
func TestAPI(t *testing.T) {
	srv := newServer(t, "")
	getJSON := func(path string, v any) {
		t.Helper()
		code, body := get(t, nil, request(t, "GET", srv.URL+path))
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d\n%s", path, code, body)
		}
		if err := json.Unmarshal([]byte(body), v); err != nil {
			t.Fatalf("GET %s: %v\n%s", path, err, body)
		}
	}
	var st struct {
		Job   string             `json:"job"`
		State string             `json:"state"`
		Total monitor.CellCounts `json:"total"`
	}
	getJSON("/api/status", &st)
	if st.Job != "webtest" || st.State != "RUNNING" || st.Total.Done != 91 || st.Total.Total != 121 {
		t.Errorf("status = %+v, want job webtest RUNNING with 91 of 121 done", st)
	}
	// The document of `regen status --json`: schema v1, events included.
	var doc struct {
		SchemaVersion int              `json:"schema_version"`
		Events        []map[string]any `json:"events"`
	}
	getJSON("/api/status", &doc)
	if doc.SchemaVersion != monitor.SchemaVersion || len(doc.Events) != 1 || doc.Events[0]["subject"] != "http://127.0.0.1:1" {
		t.Errorf("status document: schema %d, events %+v; want schema %d with the one event", doc.SchemaVersion, doc.Events, monitor.SchemaVersion)
	}
	type page struct {
		Rows []sampleRow `json:"rows"`
		Next string      `json:"next"`
	}
	var p page
	getJSON("/api/samples?state=dead&limit=3", &p)
	if len(p.Rows) != 3 || p.Next != p.Rows[2].ID || p.Rows[0].Reason != "400: context too long" {
		t.Fatalf("dead page 1 = %+v", p)
	}
	var p2 page
	getJSON("/api/samples?state=dead&limit=3&after="+p.Next, &p2)
	if len(p2.Rows) != 2 || p2.Next != "" {
		t.Fatalf("dead page 2 = %+v, want the last 2 and no next", p2)
	}
	getJSON("/api/samples?state=rejected", &p)
	if len(p.Rows) != 5 || p.Rows[0].Reason != "empty answer" || p.Rows[0].Rule != "empty" {
		t.Errorf("rejects = %+v, want 5 with their rule and evidence", p.Rows)
	}
	// A conversation shows its earlier turns' answers beside its last one.
	var conv struct {
		Turn     int             `json:"turn"`
		Request  json.RawMessage `json:"request"`
		Response json.RawMessage `json:"response"`
		Prior    []struct {
			Turn         int             `json:"turn"`
			Lane         string          `json:"lane"`
			Attempts     int             `json:"attempts"`
			PromptTokens int             `json:"prompt_tokens"`
			Response     json.RawMessage `json:"response"`
		} `json:"prior"`
	}
	getJSON("/api/samples/M/001", &conv)
	if conv.Turn != 1 || !strings.Contains(string(conv.Response), "second answer") || !strings.Contains(string(conv.Request), "and then?") ||
		len(conv.Prior) != 1 || conv.Prior[0].Turn != 0 || conv.Prior[0].Lane != "chat" || conv.Prior[0].Attempts != 1 ||
		conv.Prior[0].PromptTokens != 3 || !strings.Contains(string(conv.Prior[0].Response), "first answer") {
		t.Errorf("sample M/001 = %+v, want turn 1 after its turn-0 answer", conv)
	}
	var one sampleRow
	getJSON("/api/samples/A/007", &one)
	var resp struct {
		Content   string `json:"content"`
		Reasoning string `json:"reasoning_content"`
	}
	if err := json.Unmarshal(one.Response, &resp); err != nil || resp.Content != "answer A/007" || resp.Reasoning != "thought" ||
		!strings.Contains(string(one.Request), "secret prompt A/007") || one.Endpoint != "http://127.0.0.1:1" || one.Origin != "a.jsonl:8" {
		t.Errorf("sample A/007 = %+v", one)
	}
	if code, _ := get(t, nil, request(t, "GET", srv.URL+"/api/samples/nope")); code != http.StatusNotFound {
		t.Errorf("unknown sample: %d, want 404", code)
	}
	for _, bad := range []string{"/api/samples?state=weird", "/api/samples?limit=0", "/api/history?window=1000h", "/api/events?limit=x"} {
		if code, _ := get(t, nil, request(t, "GET", srv.URL+bad)); code != http.StatusBadRequest {
			t.Errorf("GET %s: %d, want 400", bad, code)
		}
	}
	var h monitor.History
	getJSON("/api/history?window=10m", &h)
	// A run two hours old keeps minute rows: ten minutes back from the
	// last heartbeat's minute, the partial first one included.
	if len(h.Times) != 11 || h.BucketSeconds != 60 || h.TokensPerSec[9] != 10 || len(h.Endpoints) != 1 || *h.Endpoints[0].KVUsage[9] != 0.4 || h.Endpoints[0].KVUsage[8] != nil {
		t.Errorf("history = %+v, want 11 minutes with 10 tok/s and KV 0.4 a minute ago", h)
	}
	// Events and bad rows have the snake_case keys of the status document.
	var evs []map[string]any
	getJSON("/api/events", &evs)
	if len(evs) != 1 || evs[0]["evidence"] != "exit code 137" || evs[0]["kind"] != "endpoint_state" || evs[0]["time"] == nil {
		t.Errorf("events = %+v, want one endpoint_state event with time, kind and evidence", evs)
	}
	var bad struct {
		Count int              `json:"count"`
		First []map[string]any `json:"first"`
	}
	getJSON("/api/ingest-errors", &bad)
	if bad.Count != 1 || len(bad.First) != 1 || bad.First[0]["origin"] != "a.jsonl:999" || bad.First[0]["reason"] != "not JSON" {
		t.Errorf("ingest errors = %+v, want a.jsonl:999 not JSON", bad)
	}
}

func ptr(v float64) *float64 { return &v }
