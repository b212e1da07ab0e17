package probe

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/regen-dev/regen/internal/engine"
)

// Metrics scrapes only the server's metrics (no health check), bounded by
// the dialect's probe timeout and ctx: for views that chart a server's
// load without judging its health.
func Metrics(ctx context.Context, client *http.Client, baseURL string, d engine.Dialect) (engine.Metrics, error) {
	if d.MetricsPath == "" {
		return engine.Metrics{}, errors.New("engine has no metrics endpoint")
	}
	if client == nil {
		client = http.DefaultClient
	}
	timeout := d.ProbeTimeout
	if timeout <= 0 {
		timeout = engine.DefaultProbeTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return scrape(ctx, client, strings.TrimRight(baseURL, "/"), d)
}
