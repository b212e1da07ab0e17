package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/sim"
	"github.com/regen-dev/regen/internal/ui"
)

// TestRerunFinishedJob: a finished job run again starts no server, prints
// one DONE frame (not STARTING), and its status shows DONE with the job's
// average throughput and no endpoint left STARTING by the re-run.
func TestRerunFinishedJob(t *testing.T) {
	spec := newJob(t, "inprocess.yaml.tmpl", 30, jobParams{})
	st := openStore(t, spec)
	if _, err := startRun(t, spec, st, false).wait(t, 2*time.Minute); err != nil {
		t.Fatalf("first run: %v", err)
	}
	var out bytes.Buffer
	sum, err := Run(context.Background(), Options{Spec: spec, Store: st, Progress: ui.NewProgress(&out, false).Show, Logger: testLogger(t), ProgressEvery: time.Hour})
	if err != nil {
		t.Fatalf("re-run: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || lines[0] != "ingest: 30 rows in 1 file unchanged since the last ingest, not read again: 0 new samples, 30 already stored, 0 bad rows (dead letters)" ||
		!strings.Contains(lines[1], " t DONE ") || !strings.HasSuffix(lines[1], "| p 30/30 eta=done") {
		t.Errorf("re-run printed:\n%s\nwant the ingest line and one DONE frame", out.String())
	}
	if strings.Contains(out.String(), "STARTING") {
		t.Errorf("re-run of a finished job started something:\n%s", out.String())
	}
	if len(sum.Export.Files) == 0 {
		t.Errorf("re-run did not export")
	}
	rep := sum.Final
	if rep.State != monitor.Done || len(rep.Endpoints) != 0 || !rep.RunnerExited {
		t.Errorf("status after the re-run: %s with endpoints %+v (runner exited %v); want DONE with none", rep.State, rep.Endpoints, rep.RunnerExited)
	}
	if rep.Average == nil || rep.Average.Samples != 30 || rep.Average.TokensPerSec <= 0 {
		t.Errorf("status after the re-run: average %+v, want the job's 30 samples at a rate above zero", rep.Average)
	}
	if rep.ETA != 0 || rep.ETANote != "done" {
		t.Errorf("status after the re-run: eta %s %q, want none: done", rep.ETA, rep.ETANote)
	}
	// Its rates are the first run's, said so (issue 30 item 3): not the
	// first run's rows over the re-run's fraction of a second.
	if rr := rep.RatesRun; rr == nil || !rr.Earlier || rr.IdlePID != os.Getpid() ||
		rep.Rate1m.Tokens <= 0 || rep.Rate1m.Window != max(rr.Ended.Sub(rr.Started), time.Second) { // a second at least
		t.Errorf("status after the re-run: rates_run %+v, rate_1m %+v; want the first run's tokens over its own span", rr, rep.Rate1m)
	}
}

// flipServer fronts a real simulator and can start refusing chat requests
// (404, as vLLM answers a model it does not serve) while /health stays 200.
type flipServer struct {
	*httptest.Server
	refuse atomic.Bool
}

func newFlipServer(t *testing.T, cfg sim.Config) *flipServer {
	t.Helper()
	proxy := simProxy(t, cfg)
	f := &flipServer{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f.refuse.Load() && r.URL.Path == "/v1/chat/completions" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"object":"error","message":"The model 'm' does not exist.","type":"NotFoundError","code":404}`)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

// simProxy starts a real simulator on loopback and returns a proxy to it,
// for servers that front it.
func simProxy(t *testing.T, cfg sim.Config) *httputil.ReverseProxy {
	t.Helper()
	s, err := sim.New(cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	u, err := s.Start(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target, _ := url.Parse(u)
	return httputil.NewSingleHostReverseProxy(target)
}

func externalJob(t *testing.T, url, engine, model string, n int, monitorYAML string) *job.Spec {
	t.Helper()
	dir := t.TempDir()
	writePrompts(t, filepath.Join(dir, "prompts.jsonl"), n)
	return loadJobYAML(t, dir, fmt.Sprintf(`name: ext
model: %s
endpoints: [{url: %q, engine: %s}]
sources: [{partition: p, path: prompts.jsonl, prompt: prompt, id: id}]
lanes: [{name: default, concurrency: 4, max_tokens: 64}]
retry: {base_delay: 100ms, max_delay: 1s}
monitor: %s
quality: {truncated: false}  # an answer cut at 64 tokens still counts as done here
`, model, url, engine, monitorYAML))
}

func slowSim() sim.Config {
	cfg := sim.DefaultConfig()
	cfg.ModelName = "m"
	if err := cfg.Apply(map[string]any{"profile": "fast", "speed": 5, "output_mean": 400, "seed": 3, "load_time": "0s", "warmup_time": "0s"}); err != nil {
		panic(err)
	}
	return cfg
}

// TestEndpointDownShownAtOnce: an endpoint that starts refusing every
// request is DOWN in the store's heartbeat long before the next periodic
// heartbeat (here 10 minutes away), DOWN since the moment it went down
// (not since it became READY), and READY again since it came back.
func TestEndpointDownShownAtOnce(t *testing.T) {
	srv := newFlipServer(t, slowSim())
	spec := externalJob(t, srv.URL, "sglang", "m", 400, "{heartbeat_every: 10m, dead_after: 20m, stall_after: 20m, hang_after: 20m}")
	st := openStore(t, spec)
	r := startRun(t, spec, st, true)
	endpoint := func() (monitor.EndpointStatus, monitor.Report) {
		rep, err := monitor.Assess(context.Background(), st, monitor.AssessOptions{Now: time.Now(), DeadAfter: spec.Monitor.DeadAfter})
		if err != nil || len(rep.Endpoints) != 1 {
			return monitor.EndpointStatus{}, rep
		}
		return rep.Endpoints[0], rep
	}
	waitFor(t, r, 60*time.Second, "the endpoint READY with samples done", func() bool {
		e, rep := endpoint()
		return e.State == monitor.Ready && rep.Total.Done > 0
	})
	readySince, _ := endpoint()

	flipped := time.Now()
	srv.refuse.Store(true)
	var down monitor.EndpointStatus
	var rep monitor.Report
	waitFor(t, r, 60*time.Second, "the endpoint DOWN in status (the periodic heartbeat is 10 minutes away)", func() bool {
		down, rep = endpoint()
		return down.State == monitor.Down
	})
	t.Logf("server refusing every request to DOWN in regen status: %s (heartbeat_every 10m)", time.Since(flipped).Round(time.Millisecond))
	if down.Since.Before(flipped) {
		t.Errorf("DOWN since %s, before the server started refusing at %s (READY since %s)", down.Since, flipped, readySince.Since)
	}
	if !strings.Contains(down.Cause, "does not exist") {
		t.Errorf("DOWN cause %q does not carry the server's words", down.Cause)
	}
	if rep.State != monitor.Down || rep.ETA != 0 {
		t.Errorf("job %s with ETA %s; want DOWN and no ETA", rep.State, rep.ETA)
	}
	var recorded bool
	for _, e := range events(t, st) {
		recorded = recorded || (e.Kind == "breaker" && e.State == "DOWN" && e.Subject == srv.URL && !e.Time.Before(flipped))
	}
	if !recorded {
		t.Errorf("no breaker DOWN event for %s after the flip: %+v", srv.URL, events(t, st))
	}

	healed := time.Now()
	srv.refuse.Store(false)
	var back monitor.EndpointStatus
	waitFor(t, r, 60*time.Second, "the endpoint READY again", func() bool {
		back, _ = endpoint()
		return back.State == monitor.Ready
	})
	if back.Since.Before(healed) {
		t.Errorf("READY since %s, before the server healed at %s", back.Since, healed)
	}
}

// TestModelCheckedAtReadiness: a vLLM endpoint that does not serve the
// job's model would answer 404 to every request, so it is refused at
// readiness with the names it serves and nothing is sent to it; with no
// other endpoint the run stops at once, naming the job file's line; an
// SGLang endpoint answers any name, so the job runs with a warning shown.
func TestModelCheckedAtReadiness(t *testing.T) {
	t.Run("vllm refuses", func(t *testing.T) {
		cfg := slowSim()
		cfg.ModelName = "served-model"
		cfg.Engine = "vllm"
		srv := newFlipServer(t, cfg)
		spec := externalJob(t, srv.URL, "vllm", "job-model", 20, "{heartbeat_every: 100ms}")
		st := openStore(t, spec)
		r := startRun(t, spec, st, true)
		_, err := r.wait(t, time.Minute)
		var refused *RefusedError
		if !errors.As(err, &refused) || !strings.Contains(err.Error(), `serves "served-model", not the job's model "job-model"`) ||
			!strings.Contains(err.Error(), "set model: at job.yaml:2") {
			t.Fatalf("run = %v; want a refusal naming what the server serves and the model: line", err)
		}
		rep, aerr := monitor.Assess(context.Background(), st, monitor.AssessOptions{Now: time.Now(), DeadAfter: spec.Monitor.DeadAfter})
		if aerr != nil {
			t.Fatal(aerr)
		}
		if rep.Total.Done+rep.Total.Dead+rep.Total.InFlight != 0 {
			t.Errorf("requests went to an endpoint that refuses the model: %+v", rep.Total)
		}
	})
	t.Run("sglang warns", func(t *testing.T) {
		cfg := slowSim()
		cfg.ModelName = "served-model"
		if err := cfg.Apply(map[string]any{"speed": 100, "output_mean": 20}); err != nil {
			t.Fatal(err)
		}
		srv := newFlipServer(t, cfg)
		spec := externalJob(t, srv.URL, "sglang", "job-model", 20, "{heartbeat_every: 100ms}")
		st := openStore(t, spec)
		var out bytes.Buffer
		sum, err := Run(context.Background(), Options{Spec: spec, Store: st, Progress: ui.NewProgress(&out, false).Show, Logger: testLogger(t), ProgressEvery: time.Hour, NoExport: true})
		if err != nil {
			t.Fatalf("run: %v", err)
		}
		if sum.Final.Total.Done != 20 {
			t.Errorf("done %d of 20", sum.Final.Total.Done)
		}
		if !strings.Contains(out.String(), `warning: serves "served-model", not the job's model "job-model"`) {
			t.Errorf("the view did not show the model warning:\n%s", out.String())
		}
		var warned bool
		for _, e := range events(t, st) {
			warned = warned || (e.Kind == "model_check" && e.Subject == srv.URL)
		}
		if !warned {
			t.Errorf("no model_check event recorded")
		}
	})
}
