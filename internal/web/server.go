package web

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
)

//go:embed assets
var assets embed.FS

// Store is what the dashboard reads besides the report: the sample
// browser's listings and the workers' journal.
type Store interface {
	store.Browse
	store.JournalReader
}

// Options configure a dashboard.
type Options struct {
	Store Store
	// Report is the job's status report: the same function `regen status`
	// calls, so /api/status is the document `status --json` prints.
	Report  func(ctx context.Context) (monitor.Report, error)
	Metrics *monitor.Metrics
	// Token, when set, is required on every request.
	Token  string
	Logger *slog.Logger
	// Every is the live-update period of the event stream; default 2s.
	Every time.Duration
	Now   func() time.Time
	// JobDir is the job file's folder: source origins are served relative
	// to it (job.RelTo), also those stored absolute by older versions.
	JobDir string
	// ServedBy is the command serving the page, "run" or "watch": a page
	// served by `regen run` ends with that run, and says so. JobFile is the
	// job file as the user named it, for the command the page suggests.
	ServedBy string
	JobFile  string
}

// Server is the dashboard's handler set.
type Server struct {
	o       Options
	handler http.Handler
}

// Limits on what one request may ask for.
const (
	maxHistory    = 48 * time.Hour
	maxEvents     = 2000
	maxPage       = 500
	ingestListing = 100
)

// New builds the dashboard. Its Handler checks the token when one is set;
// without one it answers only to loopback host names.
func New(o Options) (*Server, error) {
	if o.Store == nil || o.Report == nil {
		return nil, errors.New("web: a store and a report function are required")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Every <= 0 {
		o.Every = 2 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Metrics == nil {
		o.Metrics = monitor.NewMetrics(o.Report)
	}
	s := &Server{o: o}
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, fmt.Errorf("web assets: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /assets/", http.StripPrefix("/assets/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.ServeFileFS(w, r, static, "index.html")
	})
	mux.HandleFunc("GET /api/status", s.status)
	mux.HandleFunc("GET /api/history", s.history)
	mux.HandleFunc("GET /api/events", s.events)
	mux.HandleFunc("GET /api/samples", s.samples)
	mux.HandleFunc("GET /api/samples/{id...}", s.sample)
	mux.HandleFunc("GET /api/ingest-errors", s.ingestErrors)
	mux.HandleFunc("GET /api/stream", s.stream)
	mux.HandleFunc("GET /api/server", s.server)
	mux.Handle("GET /metrics", promhttp.HandlerFor(o.Metrics.Registry(), promhttp.HandlerOpts{}))

	var h http.Handler = mux
	if o.Token != "" {
		h = requireToken(o.Token, h)
	} else {
		h = loopbackHostOnly(h)
	}
	s.handler = readOnly(h)
	return s, nil
}

// Handler is the whole chain: read-only guard, token or loopback check, routes.
func (s *Server) Handler() http.Handler { return s.handler }

// Serve listens on addr (refusing a non-loopback address without a token)
// and serves until ctx ends. ready, when not nil, receives the bound
// address once listening.
func (s *Server) Serve(ctx context.Context, addr string, ready func(net.Addr)) error {
	if err := CheckBind(addr, s.o.Token); err != nil {
		return err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("web: listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(s.o.Logger.Handler(), slog.LevelWarn),
		BaseContext: func(net.Listener) context.Context { return ctx }}
	if ready != nil {
		ready(l.Addr())
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shut)
	}()
	err = srv.Serve(l)
	<-done
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("web: serve %s: %w", addr, err)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// fail answers a read error; the error names what was read, never a prompt.
func (s *Server) fail(w http.ResponseWriter, what string, err error) {
	s.o.Logger.Warn("dashboard read", "what", what, "err", err)
	http.Error(w, what+": "+err.Error(), http.StatusInternalServerError)
}

func intParam(r *http.Request, name string, def, lo, hi int) (int, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s must be a whole number from %d to %d", name, lo, hi)
	}
	return n, nil
}

// status is the report exactly as `regen status --json` prints it
// (docs/status-json.md).
func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	rep, err := s.o.Report(r.Context())
	if err != nil {
		s.fail(w, "status", err)
		return
	}
	writeJSON(w, rep)
}

// server says who serves the page: the command and its process, so a
// page left open knows what it lost when the connection goes.
func (s *Server) server(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, struct {
		ServedBy string `json:"served_by"`
		PID      int    `json:"pid"`
		JobFile  string `json:"job_file"`
	}{s.o.ServedBy, os.Getpid(), s.o.JobFile})
}

// history serves the job's series. Without window= (or with
// window=job) the axis spans the newest run, start to last heartbeat, by
// the one rule stats.AxisFor; a duration asks for that much before the
// last heartbeat instead.
func (s *Server) history(w http.ResponseWriter, r *http.Request) {
	var window time.Duration
	if v := r.URL.Query().Get("window"); v != "" && v != "job" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Minute || d > maxHistory {
			http.Error(w, fmt.Sprintf("window must be job or a duration from 1m to %s", maxHistory), http.StatusBadRequest)
			return
		}
		window = d
	}
	hbs, err := s.o.Store.Heartbeats(r.Context())
	if err != nil {
		s.fail(w, "history", err)
		return
	}
	span, ok := monitor.SpanOf(hbs)
	now := s.o.Now()
	a := monitor.JobAxis(span, ok, now, window)
	if a.Window() > maxHistory {
		a = monitor.JobAxis(span, ok, now, maxHistory)
	}
	h, err := monitor.ReadHistory(r.Context(), s.o.Store, a, now)
	if err != nil {
		s.fail(w, "history", err)
		return
	}
	writeJSON(w, h)
}

func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	limit, err := intParam(r, "limit", 200, 1, maxEvents)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	evs, err := s.o.Store.Events(r.Context(), limit)
	if err != nil {
		s.fail(w, "events", err)
		return
	}
	// The same event objects as the status document's.
	out := make([]monitor.Event, 0, len(evs))
	for _, e := range evs {
		out = append(out, monitor.EventOf(e))
	}
	writeJSON(w, out)
}

func (s *Server) ingestErrors(w http.ResponseWriter, r *http.Request) {
	n, err := s.o.Store.IngestErrorCount(r.Context())
	if err != nil {
		s.fail(w, "bad source rows", err)
		return
	}
	rows, err := s.o.Store.IngestErrors(r.Context(), ingestListing)
	if err != nil {
		s.fail(w, "bad source rows", err)
		return
	}
	first := make([]badRow, 0, len(rows))
	for _, e := range rows {
		first = append(first, badRow{Partition: e.Partition, Origin: job.RelTo(s.o.JobDir, e.Origin), Field: e.Field, Reason: e.Reason})
	}
	writeJSON(w, struct {
		Count int      `json:"count"`
		First []badRow `json:"first"`
	}{n, first})
}

// badRow is a source row that could not become a sample, with snake_case
// keys like every other document regen serves.
type badRow struct {
	Partition string `json:"partition"`
	Origin    string `json:"origin"` // file:line
	Field     string `json:"field"`
	Reason    string `json:"reason"`
}
