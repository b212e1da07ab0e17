package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/regen-dev/regen/internal/dispatch"
	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
)

// modelCheckTimeout bounds the /v1/models request made at readiness.
const modelCheckTimeout = 5 * time.Second

// servedModels returns the model names url lists at /v1/models.
func servedModels(ctx context.Context, url, apiKey string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, modelCheckTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(url, "/")+engine.ModelsPath, nil)
	if err != nil {
		return nil, err
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list); err != nil {
		return nil, fmt.Errorf("decode model list: %w", err)
	}
	names := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		names = append(names, m.ID)
	}
	return names, nil
}

// serverDialect is the dialect of the server a job launches: the
// simulator's in the mode its sim block names (engine.SimAs).
func serverDialect(srv job.Server) engine.Dialect {
	if srv.Engine == engine.Sim {
		mode, _ := srv.Sim["engine"].(string)
		if d, err := engine.SimAs(mode); err == nil {
			return d
		}
	}
	d, err := engine.Lookup(srv.Engine)
	if err != nil {
		d, _ = engine.Lookup(engine.SGLang)
	}
	return d
}

// endpointEngine returns the dialect and API key of one of the job's URLs.
func (r *runState) endpointEngine(url string) (engine.Dialect, string) {
	spec := r.o.Spec
	name, key := "", ""
	listed := false
	for _, e := range spec.Endpoints {
		if e.URL == url {
			name, listed = e.Engine, true
			if e.APIKeyEnv != "" {
				key = os.Getenv(e.APIKeyEnv)
			}
		}
	}
	if !listed && spec.Server != nil {
		return serverDialect(*spec.Server), key
	}
	if en, ok := r.fleet.(interface {
		Engine(string) (engine.Dialect, bool)
	}); ok {
		if d, settled := en.Engine(url); settled && d.Name != "" {
			return d, key
		}
	}
	d, err := engine.Lookup(name)
	if err != nil {
		d, _ = engine.Lookup(engine.SGLang)
	}
	return d, key
}

// engineDetected records the engine a server named for an endpoint the
// job left without engine: (probeFleet.detectEngine).
func (r *runState) engineDetected(ctx context.Context, url, evidence string) {
	r.o.Logger.Info("engine", "endpoint", url, "evidence", evidence)
	r.event(ctx, store.Event{Kind: "engine", Subject: url, Evidence: evidence})
	r.note("regen: " + url + ": " + evidence)
}

// tokenIDFields are the request fields that ask url's engine for token ids
// when the job exports them; an engine that cannot give them is told once.
func (r *runState) tokenIDFields(url string) []string {
	if !r.o.Spec.Output.TokenIDs {
		return nil
	}
	d, _ := r.endpointEngine(url)
	if d.TokenIDFields == nil {
		r.note(fmt.Sprintf("regen: %s (%s) cannot return token ids on streamed chat completions; its records export token_ids: unavailable", url, d.Name))
	}
	return d.TokenIDFields
}

// checkModel asks a server that just became ready what it is (its
// version, for the provenance of its answers) and which models it serves:
// the one it answers with is recorded for the configuration generation, or
// refused when it differs from the one recorded (checkServed).
// When the job's model is not among them it returns the refusal for a
// server that would answer 404 to every request (vLLM); for one that
// answers any name (SGLang, llama-server) it records a warning instead,
// shown with the endpoint, and returns "". A server that does not list
// its models is not second-guessed.
func (r *runState) checkModel(ctx context.Context, url string) (refusal string) {
	d, key := r.endpointEngine(url)
	r.identify(ctx, url, d)
	served, err := servedModels(ctx, url, key)
	if err != nil || len(served) == 0 {
		r.o.Logger.Info("model check skipped", "endpoint", url, "err", err)
		return ""
	}
	if refusal := r.checkServed(ctx, url, served); refusal != "" {
		return refusal
	}
	want := r.o.Spec.Model
	if want == "" {
		return ""
	}
	r.mu.Lock()
	delete(r.modelWarnings, url)
	r.mu.Unlock()
	if slices.Contains(served, want) {
		return ""
	}
	list := `"` + strings.Join(served, `", "`) + `"`
	if d.RejectsUnknownModel {
		refusal = fmt.Sprintf("serves %s, not the job's model %q: %s answers 404 to every request; set model: in %s",
			list, want, d.Name, r.o.Spec.Path)
		r.o.Logger.Warn("model not served", "endpoint", url, "served", served, "model", want)
		r.note("regen: " + url + " refused: " + refusal)
		return refusal
	}
	warning := fmt.Sprintf("warning: serves %s, not the job's model %q; %s answers any model name with the model it loaded, so requests go on: check model: in %s",
		list, want, d.Name, r.o.Spec.Path)
	r.o.Logger.Warn("model not served", "endpoint", url, "served", served, "model", want, "engine", d.Name)
	r.mu.Lock()
	r.modelWarnings[url] = warning
	r.mu.Unlock()
	r.event(ctx, store.Event{Kind: "model_check", Subject: url, Evidence: warning})
	r.note("regen: " + url + " " + warning)
	return ""
}

// explainRefusal adds to a poison-guard stop for HTTP 404 the models the
// refusing server lists at /v1/models: the job's model name is the usual
// cause, and the server's own list says what to write instead.
func (r *runState) explainRefusal(ctx context.Context, err error) error {
	var pe *dispatch.PoisonError
	if !errors.As(err, &pe) || pe.Status != http.StatusNotFound || pe.Endpoint == "" {
		return err
	}
	_, key := r.endpointEngine(pe.Endpoint)
	served, merr := servedModels(ctx, pe.Endpoint, key)
	if merr != nil || len(served) == 0 {
		return fmt.Errorf("%w; %s lists no models at %s (%v)", err, pe.Endpoint, engine.ModelsPath, merr)
	}
	return fmt.Errorf("%w; %s serves %s, the job asks for %q (model: in %s)",
		err, pe.Endpoint, `"`+strings.Join(served, `", "`)+`"`, r.o.Spec.Model, filepath.Base(r.o.Spec.Path))
}

// NothingDoneError is returned by a run that finished with every sample
// dead-lettered or rejected: the training files hold no row, and that is
// a failure to report, not a success.
type NothingDoneError struct {
	Total, Dead, Rejected int
}

func (e *NothingDoneError) Error() string {
	return fmt.Sprintf("job finished with no sample done: %d of %d dead-lettered, %d rejected; the training files are empty (regen status lists the reasons)",
		e.Dead, e.Total, e.Rejected)
}

// nothingDone returns a NothingDoneError when the job has samples and none
// of them is done.
func (r *runState) nothingDone(ctx context.Context) error {
	counts, err := r.o.Store.Counts(ctx)
	if err != nil {
		return nil // the run finished; the counts only judge it
	}
	_, t := monitor.Cells(counts)
	if t.Total == 0 || t.Done > 0 {
		return nil
	}
	return &NothingDoneError{Total: t.Total, Dead: t.Dead, Rejected: t.Rejected}
}
