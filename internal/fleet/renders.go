package fleet

import (
	"context"

	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/probe"
)

// renderRoute is the chat render route the dispatcher checks each turn's
// prompt ids with (dispatch.Server.Render): the dialect's, when the job
// exports token ids and the server answers it. Probed once per URL; a
// server that did not answer the probe is asked again at its next
// identification.
func (f *Fleet) renderRoute(ctx context.Context, url string, d engine.Dialect) string {
	if !f.cfg.Spec.Output.TokenIDs || d.RenderPath == "" {
		return ""
	}
	f.mu.Lock()
	path, known := f.render[url]
	f.mu.Unlock()
	if known {
		return path
	}
	_, key := f.Engine(url)
	ok, err := probe.Render(ctx, nil, url, d, key)
	if err != nil {
		f.log.Info("render route unknown", "endpoint", url, "err", err)
		return ""
	}
	if ok {
		path = d.RenderPath
		f.log.Info("render route: each turn's prompt ids are checked against it", "endpoint", url, "path", path)
	}
	f.mu.Lock()
	f.render[url] = path
	f.mu.Unlock()
	return path
}
