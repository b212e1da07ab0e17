package export

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/goccy/go-yaml"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

// hubEnums are the Hub's documented values (testdata/hub-card-metadata.yaml
// names its sources).
type hubEnums struct {
	License             []string `yaml:"license"`
	SizeCategories      []string `yaml:"size_categories"`
	AnnotationsCreators []string `yaml:"annotations_creators"`
	TaskCategories      []string `yaml:"task_categories"`
	Keys                []string `yaml:"keys"`
}

func loadHubEnums(t *testing.T) hubEnums {
	t.Helper()
	b, err := os.ReadFile("testdata/hub-card-metadata.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var e hubEnums
	if err := yaml.Unmarshal(b, &e); err != nil {
		t.Fatal(err)
	}
	return e
}

// frontMatter parses a card's YAML front matter.
func frontMatter(t *testing.T, card []byte) map[string]any {
	t.Helper()
	rest, ok := bytes.CutPrefix(card, []byte("---\n"))
	end := bytes.Index(rest, []byte("\n---\n"))
	if !ok || end < 0 {
		t.Fatalf("card has no front matter:\n%s", card)
	}
	var fm map[string]any
	if err := yaml.Unmarshal(rest[:end+1], &fm); err != nil {
		t.Fatalf("front matter: %v\n%s", err, rest[:end])
	}
	return fm
}

func strs(t *testing.T, fm map[string]any, key string) []string {
	t.Helper()
	v, ok := fm[key].([]any)
	if !ok {
		t.Fatalf("%s = %#v, want a list", key, fm[key])
	}
	var out []string
	for _, x := range v {
		s, ok := x.(string)
		if !ok {
			t.Fatalf("%s holds %#v, want strings", key, x)
		}
		out = append(out, s)
	}
	return out
}

var languageCode = regexp.MustCompile(`^([a-z]{2,3}|code|multilingual)$`)

// TestCardFrontMatterValid: every card regen writes carries only the keys
// the Hub documents, each with a documented value: with and without a
// license and languages, a title that needs quoting, and each size bucket.
func TestCardFrontMatterValid(t *testing.T) {
	enums := loadHubEnums(t)
	base := Manifest{Job: JobInfo{Name: "demo", Model: "m"},
		Files: []ManifestFile{{Format: FormatShareGPT, Path: "data/demo.sharegpt.jsonl"}, {Format: FormatParquet, Path: "data/demo.parquet"}}}
	for _, tc := range []struct {
		name string
		job  JobInfo
		done int
	}{
		{"no license", JobInfo{Name: "demo", Model: "m"}, 0},
		{"licensed", JobInfo{Name: "demo", Model: "m", License: "apache-2.0", Language: []string{"en", "fr"}, PrettyName: `My: "quoted" set`,
			SourceDatasets: []string{"glaiveai/glaive-function-calling-v2"}}, 999},
		{"1K", JobInfo{Name: "demo", Model: "m"}, 1_000},
		{"2B", JobInfo{Name: "demo", Model: "m"}, 2_000_000_000},
		{"2T", JobInfo{Name: "demo", Model: "m"}, 2_000_000_000_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := base
			m.Job, m.Totals.Done = tc.job, tc.done
			fm := frontMatter(t, card(&m))
			for k := range fm {
				if !slices.Contains(enums.Keys, k) {
					t.Errorf("key %q is not in the Hub's datasetcard.md", k)
				}
			}
			if lic, _ := fm["license"].(string); !slices.Contains(enums.License, lic) {
				t.Errorf("license %q is not a Hub license id", fm["license"])
			}
			if want := cmpOr(tc.job.License, "other"); fm["license"] != want {
				t.Errorf("license %q, want %q", fm["license"], want)
			}
			if name, _ := fm["pretty_name"].(string); name != cmpOr(tc.job.PrettyName, tc.job.Name) {
				t.Errorf("pretty_name %q", fm["pretty_name"])
			}
			for key, allowed := range map[string][]string{"size_categories": enums.SizeCategories,
				"task_categories": enums.TaskCategories, "annotations_creators": enums.AnnotationsCreators} {
				for _, v := range strs(t, fm, key) {
					if !slices.Contains(allowed, v) {
						t.Errorf("%s: %q is not a documented value", key, v)
					}
				}
			}
			if fm["language"] != nil {
				for _, l := range strs(t, fm, "language") {
					if !languageCode.MatchString(l) {
						t.Errorf("language %q is not an ISO 639 code", l)
					}
				}
			}
			if got := len(tc.job.SourceDatasets); got > 0 && !slices.Equal(strs(t, fm, "source_datasets"), tc.job.SourceDatasets) {
				t.Errorf("source_datasets %v, want %v", fm["source_datasets"], tc.job.SourceDatasets)
			}
			checkConfigs(t, fm, m.Files)
		})
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// checkConfigs: one config per training file, one of them the default,
// each with a train split naming a listed file.
// TestCardNamesWhatAnswered: the card and the manifest's job block name the
// model the servers answered with and the engine they reported, not the
// job's model or default engine; the build details are not in the first
// sentence (issue 30 item 5).
func TestCardNamesWhatAnswered(t *testing.T) {
	p := store.Provenance{Generation: 1, Model: "moonshotai/Kimi-K2.5", Engine: "llamacpp", EngineVersion: "b6000"}
	row := doneRow(t, "P1/a1", `{"messages":[{"role":"user","content":"hi"}]}`, llm.Result{Content: "hello", FinishReason: "stop"})
	row.Result.Response = withProvenance(t, llm.Result{Content: "hello", FinishReason: "stop", Model: p.Model}, p)
	d := describeFixture
	d.RegenVersion = "dev, no commit recorded (built by go run or without VCS stamping)"
	d.Job.Engine = "sglang" // what a job with a detected endpoint used to claim
	d.Configuration = json.RawMessage(`{"model":"sim-model","sources":[{"partition":"P1","path":"data/x.jsonl","regenerate":"last","samples_per_prompt":2}],
		"lanes":[{"name":"short","max_tokens":512}],"generation":{"temperature":0.7,"top_p":null,"chat_template_kwargs":{"thinking":true},"reasoning":"strip_history"}}`)
	dir := t.TempDir()
	if _, err := ExportWith(context.Background(), &fakeStore{rows: []store.Row{row}}, dir, Formats, "demo", Options{Describe: d, TokenIDs: true}); err != nil {
		t.Fatal(err)
	}
	m := readManifest(t, dir, "demo")
	if m.Job.Engine != "llamacpp" {
		t.Errorf("manifest job.engine %q, want the reported llamacpp", m.Job.Engine)
	}
	b, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	_, body, _ := strings.Cut(strings.TrimPrefix(text, "---\n"), "\n---\n")
	// The first sentence: the line after the title.
	first := strings.SplitN(strings.TrimSpace(body), "\n", 4)[2]
	for _, want := range []string{"`moonshotai/Kimi-K2.5` (the job asked for `sim-model`", "served by llamacpp b6000"} {
		if !strings.Contains(first, want) {
			t.Errorf("first sentence lacks %q:\n%s", want, first)
		}
	}
	if strings.Contains(first, "no commit recorded") || strings.Contains(text, "served by sglang") {
		t.Errorf("first sentence has build details or the default engine:\n%s", first)
	}
	for _, want := range []string{
		"Built with regen dev, no commit recorded",
		"- `P1` from `data/x.jsonl`: regenerated the last assistant turn (earlier turns are the source's); 2 answers per prompt, each with its own seed.",
		"- Sampling: temperature 0.7, top_p the server's default; max_tokens 512 in lane `short`.",
		"- chat_template_kwargs: `{\"thinking\":true}`.",
		"- Reasoning (`strip_history`): kept in the records",
		"`input_ids` list<int32>, `loss_mask` list<int8>, `token_ids` string?",      // Parquet with token ids
		"`truncated` bool, `chat_template_kwargs` string?, `input_ids` list<int32>", // ShareGPT with token ids
	} {
		if !strings.Contains(text, want) {
			t.Errorf("card lacks %q:\n%s", want, text)
		}
	}
}

// TestDescribeJobDetectedEngine: an endpoint whose engine regen detects
// gives the manifest no engine from the job (not the sglang default); one
// the job names gives that one; output's card fields reach the job block.
func TestDescribeJobDetectedEngine(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ endpoint, want string }{
		{"{url: http://127.0.0.1:8080}", ""},
		{"{url: http://127.0.0.1:8080, engine: vllm}", "vllm"},
	} {
		src := "name: d\nmodel: m\nsources: [{partition: p, path: p.jsonl, prompt: q}]\nendpoints: [" + tc.endpoint + "]\n" +
			"output: {license: mit, language: [en], pretty_name: Nice, source_datasets: [org/set]}\n"
		spec, err := job.Parse(filepath.Join(dir, "job.yaml"), []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		d, err := DescribeJob(spec, "v1")
		if err != nil {
			t.Fatal(err)
		}
		if d.Job.Engine != tc.want {
			t.Errorf("%s: engine %q, want %q", tc.endpoint, d.Job.Engine, tc.want)
		}
		if d.Job.License != "mit" || !slices.Equal(d.Job.Language, []string{"en"}) || d.Job.PrettyName != "Nice" || !slices.Equal(d.Job.SourceDatasets, []string{"org/set"}) {
			t.Errorf("job block %+v lacks the output's card fields", d.Job)
		}
	}
}

// loaderRules are testdata/loader-rules.yaml: the datasets and speculators
// file-picking rules, with their sources.
type loaderRules struct {
	Datasets struct {
		Source             string            `yaml:"source"`
		OneBuilderPerCard  bool              `yaml:"one_builder_per_card"`
		BuilderByExtension map[string]string `yaml:"builder_by_extension"`
		MaxDefaults        int               `yaml:"max_defaults"`
		FolderSource       string            `yaml:"folder_source"`
		FolderDrawOrder    []string          `yaml:"folder_draw_order"`
	} `yaml:"datasets"`
	Speculators struct {
		Source         string   `yaml:"source"`
		FolderSuffixes []string `yaml:"folder_suffixes"`
		Recursive      bool     `yaml:"recursive"`
	} `yaml:"speculators"`
}

func loadLoaderRules(t *testing.T) loaderRules {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "loader-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var r loaderRules
	if err := yaml.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if r.Datasets.Source == "" || r.Speculators.Source == "" || len(r.Datasets.BuilderByExtension) == 0 || len(r.Speculators.FolderSuffixes) == 0 {
		t.Fatalf("loader-rules.yaml lacks a rule or its source: %+v", r)
	}
	return r
}

// checkConfigs applies the datasets rules to a card's configs: every
// config's files are of the builder the first config's files infer (one
// builder per card), at most one default, and each config names a training
// file of the manifest in the config's format.
func checkConfigs(t *testing.T, fm map[string]any, files []ManifestFile) {
	t.Helper()
	rules := loadLoaderRules(t).Datasets
	configs, _ := fm["configs"].([]any)
	if len(configs) == 0 {
		t.Fatalf("configs %#v, want at least one", fm["configs"])
	}
	builder, defaults := "", 0
	for _, c := range configs {
		c := c.(map[string]any)
		if c["default"] == true {
			defaults++
		}
		for _, d := range c["data_files"].([]any) {
			df := d.(map[string]any)
			path, _ := df["path"].(string)
			b := rules.BuilderByExtension[filepath.Ext(path)]
			if b == "" {
				t.Errorf("config %v: %q has no builder (%s)", c["config_name"], path, rules.Source)
			}
			if builder == "" {
				builder = b
			}
			if rules.OneBuilderPerCard && b != builder {
				t.Errorf("config %v: %q needs the %s builder, but the card's first config infers %s for every config (%s)", c["config_name"], path, b, builder, rules.Source)
			}
			if df["split"] != "train" || !slices.ContainsFunc(files, func(f ManifestFile) bool { return f.Path == path && f.Format == c["config_name"] }) {
				t.Errorf("config %v names %v, not a training file of the manifest", c["config_name"], df)
			}
			if !strings.HasPrefix(path, DataDir+"/") {
				t.Errorf("config %v names %q, outside %s/", c["config_name"], path, DataDir)
			}
		}
	}
	if defaults > rules.MaxDefaults {
		t.Errorf("%d default configs, want at most %d", defaults, rules.MaxDefaults)
	}
}
