package fleet

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/dispatch"
	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/job"
)

// serverRecorder is a Dispatcher that keeps what SetServer was given.
type serverRecorder struct {
	Dispatcher
	mu      sync.Mutex
	servers []dispatch.Server
}

func (r *serverRecorder) SetServer(url string, s dispatch.Server) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.servers = append(r.servers, s)
}

func (r *serverRecorder) last() dispatch.Server {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.servers[len(r.servers)-1]
}

// renderServer answers the render route with statuses in turn (the last
// one from then on), 200 with ids, and its version.
func renderServer(t *testing.T, statuses ...int) (*httptest.Server, *int) {
	t.Helper()
	var mu sync.Mutex
	asked := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/version" {
			io.WriteString(w, `{"version":"0.21.0"}`)
			return
		}
		mu.Lock()
		st := statuses[min(asked, len(statuses)-1)]
		asked++
		mu.Unlock()
		w.WriteHeader(st)
		if st == http.StatusOK {
			io.WriteString(w, `{"token_ids":[1,2,3]}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &asked
}

func renderFleet(url string) (*Fleet, *serverRecorder) {
	rec := &serverRecorder{}
	spec := &job.Spec{Name: "j", Path: "job.yaml", Endpoints: []job.Endpoint{{URL: url, Engine: "vllm"}}}
	spec.Output.TokenIDs = true
	return &Fleet{cfg: Config{Spec: spec}, log: slog.New(slog.DiscardHandler), disp: rec, toldNoIDs: map[string]bool{},
		render: map[string]*renderProbe{}, servers: map[string]dispatch.Server{}}, rec
}

// TestRenderRouteAskedAgainAfterAnError: a render probe answered 503 (the
// model still loading) does not turn the check off for the run: the route
// is asked again after a backoff, and once it answers, the dispatcher's
// server gets it, its version kept.
func TestRenderRouteAskedAgainAfterAnError(t *testing.T) {
	srv, asked := renderServer(t, http.StatusServiceUnavailable, http.StatusServiceUnavailable, http.StatusOK)
	f, rec := renderFleet(srv.URL)
	vllm, _ := engine.Lookup("vllm")
	ctx := context.Background()
	f.identify(ctx, srv.URL, vllm)
	if s := rec.last(); s.Render != "" || *asked != 1 {
		t.Fatalf("after a 503: Render %q, %d probes; want none yet, 1 probe", s.Render, *asked)
	}
	now := time.Now()
	f.retryRenders(ctx, now)
	if *asked != 1 {
		t.Fatalf("before the backoff: %d probes, want 1", *asked)
	}
	f.retryRenders(ctx, now.Add(renderRetryMin+time.Second)) // 503 again: the wait doubles
	f.retryRenders(ctx, now.Add(2*renderRetryMin+2*time.Second))
	if *asked != 2 {
		t.Fatalf("inside the doubled backoff: %d probes, want 2", *asked)
	}
	f.retryRenders(ctx, now.Add(4*renderRetryMin))
	s := rec.last()
	if *asked != 3 || s.Render != vllm.RenderPath || s.Version != "0.21.0" || s.Engine != "vllm" {
		t.Fatalf("after the route answered: %+v after %d probes; want Render %s, version 0.21.0, 3 probes", s, *asked, vllm.RenderPath)
	}
	f.retryRenders(ctx, now.Add(time.Hour))
	f.identify(ctx, srv.URL, vllm)
	if *asked != 3 || rec.last().Render != vllm.RenderPath {
		t.Errorf("once known: %d probes, Render %q; want no more probes, the route kept", *asked, rec.last().Render)
	}
}

// TestRenderRouteAbsentIsKept: 404 is the answer of a release without the
// route: it is kept for the run and never asked again.
func TestRenderRouteAbsentIsKept(t *testing.T) {
	srv, asked := renderServer(t, http.StatusNotFound, http.StatusOK)
	f, rec := renderFleet(srv.URL)
	vllm, _ := engine.Lookup("vllm")
	ctx := context.Background()
	f.identify(ctx, srv.URL, vllm)
	f.retryRenders(ctx, time.Now().Add(time.Hour))
	f.identify(ctx, srv.URL, vllm)
	if *asked != 1 || rec.last().Render != "" {
		t.Errorf("after a 404: %d probes, Render %q; want 1 probe, no route", *asked, rec.last().Render)
	}
}

// TestRenderRouteFoundByRetryOutlivesAnOlderProbe: identify's probe and a
// retry's may overlap; when the retry finds the route and identify's older
// probe then fails, the route stays with the dispatcher (no retry would
// follow: the verdict is known).
func TestRenderRouteFoundByRetryOutlivesAnOlderProbe(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	asked := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/version" {
			io.WriteString(w, `{"version":"0.21.0"}`)
			return
		}
		mu.Lock()
		asked++
		n := asked
		mu.Unlock()
		switch n {
		case 2: // identify's second probe: held until the retry has answered, then failed
			close(arrived)
			<-release
			w.WriteHeader(http.StatusServiceUnavailable)
		case 3:
			io.WriteString(w, `{"token_ids":[1,2,3]}`)
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(srv.Close)
	f, rec := renderFleet(srv.URL)
	vllm, _ := engine.Lookup("vllm")
	ctx := context.Background()
	f.identify(ctx, srv.URL, vllm)
	done := make(chan struct{})
	go func() { defer close(done); f.identify(ctx, srv.URL, vllm) }()
	<-arrived
	f.retryRenders(ctx, time.Now().Add(time.Hour))
	close(release)
	<-done
	if s := rec.last(); s.Render != vllm.RenderPath || s.Version != "0.21.0" {
		t.Errorf("after the retry found the route and the older probe failed: %+v; want Render %s kept", s, vllm.RenderPath)
	}
}
