package export

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/goccy/go-yaml"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/store"
)

// ManifestSchema names the manifest's layout (docs/manifest.md); a change
// that removes or retypes a field gets a new version.
const ManifestSchema = "regen.manifest/v1"

// Manifest describes one export: what made it and what it holds. It is
// written as <name>.manifest.json beside the files it lists.
type Manifest struct {
	Schema       string    `json:"schema"`
	RegenVersion string    `json:"regen_version"`
	ExportedAt   time.Time `json:"exported_at"`
	Job          JobInfo   `json:"job"`
	// Fingerprint and Generation identify the job's configuration once the
	// store records them; omitted while unknown.
	Fingerprint string `json:"fingerprint,omitempty"`
	Generation  int    `json:"generation,omitempty"`
	// Configuration is the job's settings that shape the answers (model,
	// sources, lanes, generation, quality), as the job file has them.
	Configuration json.RawMessage `json:"configuration,omitempty"`
	// Export is what the records were rendered with (Verify renders them
	// again the same way).
	Export  *ExportSettings `json:"export,omitempty"`
	Servers []Server        `json:"servers"`
	Totals  Totals          `json:"totals"`
	Cells   []Cell          `json:"cells"`
	Rejects []RejectCell    `json:"rejects"`
	// Generations counts done samples per configuration generation, when
	// the store records generations.
	Generations []GenerationCount `json:"generations,omitempty"`
	Tokens      TokenStats        `json:"tokens"`
	Files       []ManifestFile    `json:"files"`
	// HiddenStates lists the captured hidden-state files, when the job
	// captures them (Options.Captured).
	HiddenStates *HiddenStates `json:"hidden_states,omitempty"`
}

// JobInfo names the job an export came from.
type JobInfo struct {
	Name  string `json:"name"`
	File  string `json:"file,omitempty"` // the job file, relative to the output directory
	Model string `json:"model"`
	// Engine is what the servers that answered reported (comma-separated
	// when they differ), else the engine the job names; never the default
	// of an endpoint whose engine regen detects.
	Engine string `json:"engine,omitempty"`
	// The dataset card's metadata from the job's output block.
	License        string   `json:"license,omitempty"`
	Language       []string `json:"language,omitempty"`
	PrettyName     string   `json:"pretty_name,omitempty"`
	SourceDatasets []string `json:"source_datasets,omitempty"`
}

// Server is one endpoint that answered samples of this export, from the
// stored answers. Engine and EngineVersion are what the server reported,
// when the store keeps it.
type Server struct {
	Endpoint      string   `json:"endpoint"`
	Answers       int      `json:"answers"` // stored answers (turns) of exported samples
	Models        []string `json:"models"`  // model ids the server answered with
	Engine        string   `json:"engine,omitempty"`
	EngineVersion string   `json:"engine_version,omitempty"`
}

// Totals are the sample counts of the export.
type Totals struct {
	Done      int `json:"done"`
	Truncated int `json:"truncated"`
	Ended     int `json:"ended_early"`
	Rejected  int `json:"rejected"`
	Dead      int `json:"dead"`
	BadRows   int `json:"bad_rows"`
	Pending   int `json:"pending"` // not finished when the export ran (pending or leased)
	// NoSystemRows: the SpecForge profile's ShareGPT training rows without
	// a system message (SpecForge inserts its template's default).
	NoSystemRows int `json:"no_system_rows,omitempty"`
	// TokenIDs counts done conversations with and without input_ids, when
	// the export carries token ids (output.token_ids).
	TokenIDs *TokenIDCounts `json:"token_ids,omitempty"`
}

// TokenIDCounts: done conversations exported with input_ids and loss_mask,
// and those whose record says token_ids: "unavailable: <why>".
// With output.token_rows: turn they count turn rows, not conversations.
type TokenIDCounts struct {
	With        int `json:"with"`
	Unavailable int `json:"unavailable"`
}

// Cell counts one (partition, lane)'s samples by state.
type Cell struct {
	Partition string `json:"partition"`
	Lane      string `json:"lane"`
	Done      int    `json:"done"`
	Rejected  int    `json:"rejected"`
	Dead      int    `json:"dead"`
	Pending   int    `json:"pending"`
}

// RejectCell is the rejected samples of one cell by one rule.
type RejectCell struct {
	Partition string `json:"partition"`
	Lane      string `json:"lane"`
	Rule      string `json:"rule"`
	N         int    `json:"n"`
}

// GenerationCount is one configuration generation: its done samples,
// the answers a later generation superseded (kept in the store's
// history, not exported), and what it was: its fingerprint, the canonical
// configuration hashed into it and the model its servers answered with.
type GenerationCount struct {
	Generation  int             `json:"generation"`
	Done        int             `json:"done"`
	Superseded  int             `json:"superseded"`
	Fingerprint string          `json:"fingerprint"`
	ServedModel string          `json:"served_model,omitempty"`
	Config      json.RawMessage `json:"config"`
}

// TokenStats are the distributions of prompt and completion tokens over
// every stored answer (each turn of a conversation is one answer).
type TokenStats struct {
	Prompt     Percentiles `json:"prompt"`
	Completion Percentiles `json:"completion"`
}

// Percentiles summarise one token distribution (nearest rank).
type Percentiles struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean"`
	Min  int     `json:"min"`
	P50  int     `json:"p50"`
	P90  int     `json:"p90"`
	P99  int     `json:"p99"`
	Max  int     `json:"max"`
}

// ManifestFile is one file of the export.
type ManifestFile struct {
	Format string `json:"format"`
	Path   string `json:"path"` // relative to the manifest
	Rows   int    `json:"rows"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// Describe is what Options.Describe gives the manifest and the card
// beyond what the store holds.
type Describe struct {
	RegenVersion  string
	Job           JobInfo
	Configuration json.RawMessage
	Fingerprint   string
	Generation    int
	// Now is the export time the manifest and the card state (zero = the
	// clock's; tests fix it).
	Now time.Time
}

// DescribeJob fills a Describe from a job spec: its name, model, engine,
// file (relative to the output directory) and the settings that shape the
// answers, with paths relative to the job file.
func DescribeJob(spec *job.Spec, regenVersion string) (Describe, error) {
	o := spec.Output
	d := Describe{RegenVersion: regenVersion, Job: JobInfo{Name: spec.Name, Model: spec.Model,
		License: o.License, Language: o.Language, PrettyName: o.PrettyName, SourceDatasets: o.SourceDatasets}}
	if spec.Path != "" {
		if rel, err := filepath.Rel(spec.Output.Dir, spec.Path); err == nil {
			d.Job.File = filepath.ToSlash(rel)
		}
	}
	switch {
	case spec.Server != nil:
		d.Job.Engine = spec.Server.Engine
	case len(spec.Endpoints) > 0 && !spec.Endpoints[0].Detect:
		d.Job.Engine = spec.Endpoints[0].Engine
	}
	sources := slices.Clone(spec.Sources)
	for i := range sources {
		sources[i].Path = filepath.ToSlash(spec.Rel(sources[i].Path))
	}
	type lane struct {
		Name            string   `yaml:"name"`
		MaxTokens       int      `yaml:"max_tokens"`
		Partitions      []string `yaml:"partitions"`
		MaxPromptTokens int      `yaml:"max_prompt_tokens"`
	}
	lanes := make([]lane, len(spec.Lanes))
	for i, l := range spec.Lanes {
		lanes[i] = lane{l.Name, l.MaxTokens, l.Partitions, l.MaxPromptTokens}
	}
	// Through YAML: the job's own field names (snake_case), not Go's.
	y, err := yaml.Marshal(struct {
		Model      string         `yaml:"model"`
		Sources    []job.Source   `yaml:"sources"`
		Lanes      []lane         `yaml:"lanes"`
		Generation job.Generation `yaml:"generation"`
		Quality    job.Quality    `yaml:"quality"`
	}{spec.Model, sources, lanes, spec.Generation, spec.Quality})
	if err != nil {
		return d, fmt.Errorf("describe job: %w", err)
	}
	var v any
	if err := yaml.Unmarshal(y, &v); err != nil {
		return d, fmt.Errorf("describe job: %w", err)
	}
	if d.Configuration, err = json.Marshal(v); err != nil {
		return d, fmt.Errorf("describe job: %w", err)
	}
	return d, nil
}

// serverTally collects the endpoints and served models of stored answers.
type serverTally map[string]*Server

func (t serverTally) add(endpoint, model string, p store.Provenance) {
	if endpoint == "" {
		return
	}
	s := t[endpoint]
	if s == nil {
		s = &Server{Endpoint: endpoint, Models: []string{}}
		t[endpoint] = s
	}
	s.Answers++
	if model != "" && !slices.Contains(s.Models, model) {
		s.Models = append(s.Models, model)
	}
	// A restarted server may report another version: the latest answer's.
	if p.Engine != "" {
		s.Engine, s.EngineVersion = p.Engine, p.EngineVersion
	}
}

// addRecord counts every stored answer of a done or rejected record.
func (t serverTally) addRecord(r *record) {
	if r.plan == nil {
		return
	}
	for i, p := range r.row.Prior {
		t.add(p.Endpoint, r.answers[i].Model, r.provs[i])
	}
	t.add(r.row.Result.Endpoint, r.res.Model, r.last())
}

func (t serverTally) list() []Server {
	out := make([]Server, 0, len(t))
	for _, k := range slices.Sorted(maps.Keys(t)) {
		s := *t[k]
		slices.Sort(s.Models)
		out = append(out, s)
	}
	return out
}

// storeFacts reads what the manifest takes from the store's counters.
func storeFacts(ctx context.Context, st Store, m *Manifest) error {
	counts, err := st.Counts(ctx)
	if err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	cells := map[[2]string]*Cell{}
	for _, c := range counts {
		k := [2]string{c.Partition, c.Lane}
		cell := cells[k]
		if cell == nil {
			cell = &Cell{Partition: c.Partition, Lane: c.Lane}
			cells[k] = cell
		}
		switch c.State {
		case store.Done:
			cell.Done += c.N
		case store.Rejected:
			cell.Rejected += c.N
		case store.Dead:
			cell.Dead += c.N
		default:
			cell.Pending += c.N
			m.Totals.Pending += c.N
		}
	}
	m.Cells = []Cell{}
	for _, k := range slices.SortedFunc(maps.Keys(cells), func(a, b [2]string) int {
		return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1]))
	}) {
		m.Cells = append(m.Cells, *cells[k])
	}
	rejects, err := st.RejectCounts(ctx)
	if err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	m.Rejects = []RejectCell{}
	for _, r := range rejects {
		m.Rejects = append(m.Rejects, RejectCell{r.Partition, r.Lane, r.Rule, r.N})
	}
	slices.SortFunc(m.Rejects, func(a, b RejectCell) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Lane, b.Lane), cmp.Compare(a.Rule, b.Rule))
	})
	hist := map[string]map[int]int{store.PromptKind: {}, store.CompletionKind: {}}
	err = st.EachTokenCount(ctx, func(tc store.TokenCount) error {
		if h := hist[tc.Kind]; h != nil {
			h[tc.Tokens] += tc.N
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	m.Tokens = TokenStats{Prompt: percentiles(hist[store.PromptKind]), Completion: percentiles(hist[store.CompletionKind])}
	return nil
}

// generationFacts takes the configuration's fingerprint and generation
// from the store, which checked the job against them, and counts done
// samples and superseded answers per generation.
func generationFacts(ctx context.Context, st Store, m *Manifest, done map[int]int) error {
	gens, err := st.Generations(ctx)
	if err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	cur, ok := store.Current(gens)
	if !ok {
		return nil
	}
	m.Fingerprint, m.Generation = cur.Fingerprint, cur.N
	m.Generations = []GenerationCount{}
	for _, g := range gens {
		m.Generations = append(m.Generations, GenerationCount{Generation: g.N, Done: done[g.N], Superseded: g.Superseded,
			Fingerprint: g.Fingerprint, ServedModel: g.ServedModel, Config: g.Config})
	}
	return nil
}

// percentiles summarises a histogram of token counts (nearest rank).
func percentiles(h map[int]int) Percentiles {
	var p Percentiles
	keys := slices.Sorted(maps.Keys(h))
	sum := 0.0
	for _, k := range keys {
		p.N += h[k]
		sum += float64(k) * float64(h[k])
	}
	if p.N == 0 {
		return p
	}
	p.Mean = sum / float64(p.N)
	p.Min, p.Max = keys[0], keys[len(keys)-1]
	rank := func(q float64) int {
		want := max(int(math.Ceil(q*float64(p.N))), 1)
		seen := 0
		for _, k := range keys {
			seen += h[k]
			if seen >= want {
				return k
			}
		}
		return p.Max
	}
	p.P50, p.P90, p.P99 = rank(0.50), rank(0.90), rank(0.99)
	return p
}

// fileSink holds a file written whole (the card, the manifest) among the
// sinks, so it is renamed and cleaned up with the others.
type fileSink struct{ out *output }

func (fileSink) write(*record) error { return nil }
func (f fileSink) files() []*output  { return []*output{f.out} }

// describe writes the card and the manifest of the synced files outs to
// temporary files and returns them, synced, for the caller to rename after
// outs. A README.md regen did not write is kept: no card, a warning.
func describe(ctx context.Context, st Store, dir, name string, o Options, sum *Summary, seen serverTally, inputs map[string]string, outs []*output) ([]*output, error) {
	d := o.Describe
	now := d.Now
	if now.IsZero() {
		now = time.Now()
	}
	m := &Manifest{Schema: ManifestSchema, RegenVersion: d.RegenVersion, ExportedAt: now.UTC().Truncate(time.Second),
		Job: d.Job, Fingerprint: d.Fingerprint, Generation: d.Generation, Configuration: d.Configuration, Servers: seen.list(),
		Totals: Totals{Done: sum.Done, Truncated: sum.Truncated, Ended: sum.Ended, Rejected: sum.Rejected, Dead: sum.Dead, BadRows: sum.BadRows, NoSystemRows: sum.NoSystemRows}}
	m.Export = &ExportSettings{Metadata: cmp.Or(o.Metadata, MetadataMinimal), TokenIDs: o.TokenIDs, TrainTruncated: o.TrainTruncated, Profile: o.Profile}
	if o.TokenIDs && o.TokenRows == TokenRowsTurn {
		m.Export.TokenRows, m.Export.KeepHistoryReasoning = TokenRowsTurn, o.KeepHistoryReasoning
	}
	if sum.TokenIDs+sum.TokenIDsUnavailable > 0 { // output.token_ids, with done records
		m.Totals.TokenIDs = &TokenIDCounts{With: sum.TokenIDs, Unavailable: sum.TokenIDsUnavailable}
	}
	if m.Job.Name == "" {
		m.Job.Name = name
	}
	if e := servedEngines(m.Servers); e != "" {
		m.Job.Engine = e
	}
	if err := storeFacts(ctx, st, m); err != nil {
		return nil, err
	}
	if err := generationFacts(ctx, st, m, sum.DoneByGeneration); err != nil {
		return nil, err
	}
	for _, o := range outs {
		m.Files = append(m.Files, manifestFile(dir, o))
	}
	var written []*output
	hs, err := hiddenStates(ctx, dir, name, o, inputs)
	if err != nil {
		return nil, err
	}
	m.HiddenStates = hs
	if h := m.HiddenStates; h != nil {
		sums, err := wholeFile(HiddenSumsPath(dir, name), FormatHiddenSums, len(h.Files), hiddenSums(h))
		if err != nil {
			return nil, err
		}
		written = append(written, sums)
		m.Files = append(m.Files, manifestFile(dir, sums))
	}
	readme := filepath.Join(dir, "README.md")
	switch err := checkCard(readme); {
	case errors.Is(err, ErrForeignCard):
		sum.Warnings = append(sum.Warnings, err.Error())
	case err != nil:
		return nil, err
	default:
		c, err := wholeFile(readme, FormatCard, 0, card(m))
		if err != nil {
			return nil, err
		}
		written = append(written, c)
		m.Files = append(m.Files, manifestFile(dir, c))
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return written, fmt.Errorf("manifest: %w", err)
	}
	mf, err := wholeFile(ManifestPath(dir, name), FormatManifest, 0, append(b, '\n'))
	if err != nil {
		return written, err
	}
	return append(written, mf), nil
}

// manifestFile describes o, its path relative to dir.
func manifestFile(dir string, o *output) ManifestFile {
	return ManifestFile{Format: o.format, Path: relPath(dir, o.af.final), Rows: o.rows, Bytes: o.af.size, SHA256: o.af.sha256()}
}

// relPath is path relative to the export folder dir, with slashes, as the
// manifest names files; its base name when it is not inside dir.
func relPath(dir, path string) string {
	rel, err := filepath.Rel(dir, path)
	if err != nil || strings.HasPrefix(rel, "..") {
		return filepath.Base(path)
	}
	return filepath.ToSlash(rel)
}

// wholeFile writes b to a synced temporary file for final.
func wholeFile(final, format string, rows int, b []byte) (*output, error) {
	af, err := createAtomic(final)
	if err != nil {
		return nil, err
	}
	o := &output{format: format, af: af, rows: rows}
	if _, err := af.Write(b); err != nil {
		af.abort()
		return nil, fmt.Errorf("write %s: %w", final, err)
	}
	if err := af.sync(); err != nil {
		af.abort()
		return nil, err
	}
	return o, nil
}

// servedEngines names the engines the servers reported with their
// answers, "" when none did.
func servedEngines(servers []Server) string {
	var names []string
	for _, s := range servers {
		if s.Engine != "" && !slices.Contains(names, s.Engine) {
			names = append(names, s.Engine)
		}
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
