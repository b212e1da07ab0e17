package fleet

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
	"github.com/regen-dev/regen/internal/probe"
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
		return nil, httpStatus(resp.StatusCode)
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

// httpStatus is a non-200 answer to a fleet request.
type httpStatus int

func (s httpStatus) Error() string { return fmt.Sprintf("HTTP %d", int(s)) }

// credentialRefusal is the refusal of a server that answers the model list
// with 401 or 403: every request would be refused the same way.
func (f *Fleet) credentialRefusal(url string, err error) string {
	var st httpStatus
	if !errors.As(err, &st) || (st != http.StatusUnauthorized && st != http.StatusForbidden) {
		return ""
	}
	p := f.endpointPath(url)
	for _, e := range f.cfg.Spec.Endpoints {
		if e.URL == url && e.APIKeyEnv != "" {
			p += ".api_key_env"
		}
	}
	return fmt.Sprintf("refuses the job's credentials (%s at %s): check api_key_env (%s at %s) and the key it names",
		st, engine.ModelsPath, p, f.where(p))
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
func (f *Fleet) Engine(url string) (engine.Dialect, string) {
	spec := f.cfg.Spec
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
	if f.engineOf != nil {
		if d, settled := f.engineOf(url); settled && d.Name != "" {
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
func (f *Fleet) engineDetected(url, evidence string) {
	ctx := context.Background()
	f.log.Info("engine", "endpoint", url, "evidence", evidence)
	f.event(ctx, store.Event{Kind: "engine", Subject: url, Evidence: evidence})
	f.note("regen: " + url + ": " + evidence)
}

// TokenIDFields are the request fields that ask url's engine, as known
// now (named by the job or detected), for token ids when the job exports
// them; nil when it exports none or the engine cannot give them.
func (f *Fleet) TokenIDFields(url string) []string {
	if !f.cfg.Spec.Output.TokenIDs {
		return nil
	}
	d, _ := f.Engine(url)
	return d.TokenIDFields
}

// tellNoTokenIDs says once per endpoint, when it is first identified, that
// its engine cannot return the token ids the job exports: at the start of
// the run, not when the export finds every record without them.
func (f *Fleet) tellNoTokenIDs(url string, d engine.Dialect) {
	if !f.cfg.Spec.Output.TokenIDs || d.TokenIDFields != nil {
		return
	}
	f.mu.Lock()
	told := f.toldNoIDs[url]
	f.toldNoIDs[url] = true
	f.mu.Unlock()
	if told {
		return
	}
	msg := fmt.Sprintf("%s cannot return token ids on streamed chat completions; the records of %s export token_ids: unavailable (output.token_ids in %s)",
		d.Name, url, filepath.Base(f.cfg.Spec.Path))
	f.log.Warn("no token ids", "endpoint", url, "engine", d.Name)
	f.note("regen: " + url + ": " + msg)
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
func (f *Fleet) checkModel(ctx context.Context, url string) (refusal string) {
	d, key := f.Engine(url)
	f.identify(ctx, url, d)
	f.readCapacity(ctx, url, d)
	served, err := servedModels(ctx, url, key)
	if refusal := f.credentialRefusal(url, err); refusal != "" {
		f.log.Warn("credentials refused", "endpoint", url, "err", err)
		f.note("regen: " + url + " refused: " + refusal)
		return refusal
	}
	if err != nil || len(served) == 0 {
		f.log.Info("model check skipped", "endpoint", url, "err", err)
		return ""
	}
	if refusal := f.checkServed(ctx, url, served); refusal != "" {
		return refusal
	}
	want := f.cfg.Spec.Model
	if want == "" {
		return ""
	}
	f.mu.Lock()
	delete(f.warnings, url)
	f.mu.Unlock()
	if slices.Contains(served, want) {
		return ""
	}
	list := `"` + strings.Join(served, `", "`) + `"`
	if d.RejectsUnknownModel {
		refusal = fmt.Sprintf("serves %s, not the job's model %q: %s answers 404 to every request; set model: at %s",
			list, want, d.Name, f.where("model"))
		f.log.Warn("model not served", "endpoint", url, "served", served, "model", want)
		f.note("regen: " + url + " refused: " + refusal)
		return refusal
	}
	warning := fmt.Sprintf("warning: serves %s, not the job's model %q; %s answers any model name with the model it loaded, so requests go on: check model: in %s",
		list, want, d.Name, f.cfg.Spec.Path)
	f.log.Warn("model not served", "endpoint", url, "served", served, "model", want, "engine", d.Name)
	f.mu.Lock()
	f.warnings[url] = warning
	f.mu.Unlock()
	f.event(ctx, store.Event{Kind: "model_check", Subject: url, Evidence: warning})
	f.note("regen: " + url + " " + warning)
	return ""
}

// explainRefusal adds to a poison-guard stop for HTTP 404 the models the
// refusing server lists at /v1/models: the job's model name is the usual
// cause, and the server's own list says what to write instead.
func (f *Fleet) ExplainRefusal(ctx context.Context, err error) error {
	var pe *dispatch.PoisonError
	if !errors.As(err, &pe) || pe.Endpoint == "" {
		return err
	}
	switch pe.Status {
	case http.StatusUnauthorized, http.StatusForbidden:
		p := f.endpointPath(pe.Endpoint)
		return fmt.Errorf("%w (%s at %s)", err, p, f.where(p))
	case http.StatusNotFound:
	default:
		if pe.EndpointFault {
			p := f.endpointPath(pe.Endpoint) + ".url"
			return fmt.Errorf("%w (%s at %s)", err, p, f.where(p))
		}
		return err
	}
	_, key := f.Engine(pe.Endpoint)
	served, merr := servedModels(ctx, pe.Endpoint, key)
	if merr != nil || len(served) == 0 {
		return fmt.Errorf("%w; %s lists no models at %s (%v); model: is at %s", err, pe.Endpoint, engine.ModelsPath, merr, f.where("model"))
	}
	return fmt.Errorf("%w; %s serves %s, the job asks for %q (model: at %s)",
		err, pe.Endpoint, `"`+strings.Join(served, `", "`)+`"`, f.cfg.Spec.Model, f.where("model"))
}

// servedModel is the model id a server answers with: the one it lists, or
// the job's model among several; "" when that cannot be told.
func servedModel(served []string, want string) string {
	switch {
	case len(served) == 1:
		return served[0]
	case want != "" && slices.Contains(served, want):
		return want
	}
	return ""
}

// checkServed records the model the server at url answers with for the
// current generation, the first time one is known, and refuses a server
// answering with another one: its answers would mix two models in one
// dataset.
func (f *Fleet) checkServed(ctx context.Context, url string, served []string) (refusal string) {
	gen := f.cfg.Generation
	id := servedModel(served, f.cfg.Spec.Model)
	if id == "" || gen == 0 || f.cfg.Models == nil {
		return ""
	}
	recorded, err := f.cfg.Models.SetServedModel(ctx, gen, id)
	if err != nil {
		if f.cfg.Report.StoreFailed != nil {
			f.cfg.Report.StoreFailed(ctx, err)
		}
		return ""
	}
	if recorded == id {
		return ""
	}
	refusal = fmt.Sprintf("serves %q, but configuration generation %d was generated with %q (served_model: %s -> %s); "+
		"no request sent: serve %q again, or name the new model in model: in %s and run regen run --new-config",
		id, gen, recorded, recorded, id, recorded, f.cfg.Spec.Path)
	f.log.Warn("served model changed", "endpoint", url, "served", id, "recorded", recorded, "generation", gen)
	f.event(ctx, store.Event{Kind: "model_check", Subject: url, Evidence: refusal})
	f.note("regen: " + url + " refused: " + refusal)
	return refusal
}

// identify reads the server's version, stamped with its engine on every
// answer it gives (a server that does not say is recorded without one).
func (f *Fleet) identify(ctx context.Context, url string, d engine.Dialect) {
	ctx, cancel := context.WithTimeout(ctx, modelCheckTimeout)
	defer cancel()
	id, err := probe.Identify(ctx, nil, url, d)
	if err != nil {
		f.log.Info("server version unknown", "endpoint", url, "err", err)
	}
	srv := dispatch.Server{Engine: d.Name, Version: id.Version, TokenIDFields: f.TokenIDFields(url), Tokenizer: d.Tokenizer,
		Priority: id.Priority, Render: f.renderRoute(ctx, url, d)}
	f.setServer(url, func(s *dispatch.Server) {
		// A retry's probe may have found the route while this one failed:
		// the verdict recorded wins over this probe's answer.
		if p := f.render[url]; p != nil && p.known {
			srv.Render = p.path
		}
		*s = srv
	})
	f.tellNoTokenIDs(url, d)
}

// readCapacity reads the server's pool and context as it becomes ready,
// before the dispatcher resumes it: the first load probe may come a probe
// interval later (or never succeed, on a server without /metrics), and a
// prompt claimed meanwhile would be sent past the context and refused. A
// server whose /metrics does not answer is read at its capacity routes
// alone (probe.Capacity).
func (f *Fleet) readCapacity(ctx context.Context, url string, d engine.Dialect) {
	ctx, cancel := context.WithTimeout(ctx, modelCheckTimeout)
	defer cancel()
	at := time.Now()
	m, err := probe.Metrics(ctx, nil, url, d)
	if err != nil {
		if m = probe.Capacity(ctx, nil, url, d); m.Present == 0 {
			f.log.Info("capacity unknown at readiness", "endpoint", url, "err", err)
			return
		}
	}
	f.observe(url, probe.Snapshot{URL: url, Time: at, Metrics: m})
}
