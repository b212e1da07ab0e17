package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/web"
)

// webOptions are the dashboard flags shared by run and watch.
type webOptions struct {
	addr  string
	token string
	// servedBy ("run" or "watch") and jobFile (as the user named it) let
	// the page say what it lost when its server ends.
	servedBy string
	jobFile  string
}

func (o *webOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.addr, "web", "", "serve the web dashboard and /metrics on this address (e.g. 127.0.0.1:8080; a non-loopback address needs a token)")
	fs.StringVar(&o.token, "token", "", "token the dashboard requires on every request (default $"+web.TokenEnv+")")
}

// resolve fills the token from the environment and checks the bind early,
// before any work starts.
func (o *webOptions) resolve() error {
	if o.addr == "" {
		return nil
	}
	if o.token == "" {
		o.token = os.Getenv(web.TokenEnv)
	}
	return web.CheckBind(o.addr, o.token)
}

// reportFunc reads the job's status report now, with the function
// `regen status` calls, so the views say what `status --json` says.
func reportFunc(spec *job.Spec, st store.Store) func(ctx context.Context) (monitor.Report, error) {
	host, _ := os.Hostname()
	return func(ctx context.Context) (monitor.Report, error) {
		return assess(ctx, spec, st, time.Now(), host)
	}
}

// startDashboard serves the dashboard until the returned stop is called;
// the address it bound is printed to msgs.
func startDashboard(spec *job.Spec, st store.Store, o webOptions, metrics *monitor.Metrics, msgs io.Writer, log *slog.Logger) (stop func(), url string, err error) {
	srv, err := web.New(web.Options{Store: st, Report: reportFunc(spec, st), Metrics: metrics, Token: o.token, Logger: log, JobDir: spec.Dir,
		ServedBy: o.servedBy, JobFile: o.jobFile})
	if err != nil {
		return nil, "", err
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, o.addr, func(a net.Addr) { ready <- a }) }()
	select {
	case a := <-ready:
		host, _ := os.Hostname()
		url = web.URL(a, host)
		fmt.Fprintf(msgs, "regen: dashboard at %s (metrics at /metrics)\n", url)
	case err := <-done:
		cancel()
		return nil, "", err
	}
	return func() {
		cancel()
		if err := <-done; err != nil {
			log.Warn("dashboard", "err", err)
		}
	}, url, nil
}
