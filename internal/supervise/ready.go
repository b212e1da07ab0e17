package supervise

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/probe"
)

func freePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(dialHost(host), "0"))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// dialHost maps a wildcard bind address to loopback for connecting.
func dialHost(h string) string {
	switch h {
	case "", "0.0.0.0":
		return "127.0.0.1"
	case "::", "[::]":
		return "::1"
	}
	return strings.Trim(h, "[]")
}

// WaitReady polls url's readiness endpoint (the dialect's ReadyPath) until it
// answers 200, for servers regen did not launch. It returns an error naming
// the last answer when timeout passes or ctx ends first.
func WaitReady(ctx context.Context, url string, d engine.Dialect, timeout time.Duration) error {
	url = strings.TrimRight(url, "/") + d.ReadyPath
	probeTimeout := d.ProbeTimeout
	if probeTimeout <= 0 {
		probeTimeout = engine.DefaultProbeTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	last := "no answer"
	for {
		rctx, rcancel := context.WithTimeout(ctx, probeTimeout)
		code, err := probe.Health(rctx, client, url)
		rcancel()
		switch {
		case err == nil && code == http.StatusOK:
			return nil
		case err != nil:
			last = err.Error()
		default:
			last = fmt.Sprintf("status %d", code)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait ready %s: %w (last: %s)", url, ctx.Err(), last)
		case <-time.After(DefaultReadyPollEvery):
		}
	}
}
