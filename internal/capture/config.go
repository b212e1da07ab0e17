package capture

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"

	"github.com/regen-dev/regen/internal/job"
)

// FromJob is the capture of a job with a capture: section, run by owner;
// shared says other workers may run it too (a PostgreSQL store).
func FromJob(spec *job.Spec, owner string, shared bool, log *slog.Logger) (Config, error) {
	c := spec.Capture
	if c == nil {
		return Config{}, fmt.Errorf("%s has no capture: section", spec.Path)
	}
	// Transport-level limits only: one request's deadline is the context's.
	hc := &http.Client{Timeout: c.RequestTimeout}
	var eps []Endpoint
	for i, e := range c.Endpoints {
		key := ""
		if e.APIKeyEnv != "" {
			if key = os.Getenv(e.APIKeyEnv); key == "" {
				fe := spec.FieldErrorf(fmt.Sprintf("capture.endpoints[%d].api_key_env", i), "environment variable %s is empty or unset (the key of capture endpoint %s)", e.APIKeyEnv, e.URL)
				fe.File = spec.Rel(spec.Path)
				return Config{}, fe
			}
		}
		eps = append(eps, Endpoint{URL: e.URL, Client: &VLLM{URL: e.URL, Model: c.Model, APIKey: key, HTTP: hc, FileWait: c.FileWait}})
	}
	return Config{
		Dir: c.Dir, JobDir: spec.Dir, Endpoints: eps, Concurrency: c.Concurrency,
		Expect:  Expect{Layers: c.Layers, Hidden: c.Hidden, DType: c.DType},
		PerTurn: spec.Output.TokenRows == job.TokenRowsTurn, MaxAttempts: c.MaxAttempts,
		Owner: owner, Shared: shared, DownAfter: c.DownAfter, Log: log,
	}, nil
}
