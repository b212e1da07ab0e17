package export

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
)

// CardMarker is in every dataset card regen writes. A README.md in the
// output directory without it was written by someone else and is never
// replaced.
const CardMarker = "regen-dataset-card: generated"

// ErrForeignCard says the output directory holds a README.md regen did not
// write; the export keeps it and writes no card.
var ErrForeignCard = errors.New("README.md was not written by regen; kept, no dataset card written")

// checkCard reports whether path may be (re)written as regen's card.
func checkCard(path string) error {
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("read %s: %w", path, err)
	case !bytes.Contains(b, []byte(CardMarker)):
		return fmt.Errorf("%s: %w", path, ErrForeignCard)
	}
	return nil
}

// sizeCategory is the Hugging Face size_categories value for n rows
// (huggingface_hub DatasetCardData: n<1K ... 100B<n<1T, n>1T).
func sizeCategory(n int) string {
	bounds := []struct {
		max  int
		name string
	}{
		{1_000, "n<1K"}, {10_000, "1K<n<10K"}, {100_000, "10K<n<100K"}, {1_000_000, "100K<n<1M"},
		{10_000_000, "1M<n<10M"}, {100_000_000, "10M<n<100M"}, {1_000_000_000, "100M<n<1B"},
		{10_000_000_000, "1B<n<10B"}, {100_000_000_000, "10B<n<100B"}, {1_000_000_000_000, "100B<n<1T"},
	}
	for _, b := range bounds {
		if n < b.max {
			return b.name
		}
	}
	return "n>1T"
}

// LicenseUnset is the card's license when the job gives none: the Hub's
// id for a license not in its list, with the card saying why.
const LicenseUnset = "other"

// card renders the dataset card from the manifest: Hugging Face front
// matter (one config, naming the training file of one builder; license, language, size and task), then how the data was made,
// each config's row schema, the counts and the files.
func card(m *Manifest) []byte {
	var b strings.Builder
	cardFrontMatter(&b, m)
	cardIntro(&b, m)
	cardHowMade(&b, m)
	cardProfile(&b, m)
	cardSchemas(&b, m)
	cardCounts(&b, m)
	cardHiddenStates(&b, m)
	b.WriteString("## Files\n\n| file | format | rows |\n|---|---|---:|\n")
	for _, f := range m.Files {
		fmt.Fprintf(&b, "| `%s` | %s | %d |\n", f.Path, f.Format, f.Rows)
	}
	if slices.ContainsFunc(m.Files, func(f ManifestFile) bool { return f.Format == FormatOpenAIBatch }) {
		b.WriteString("\nThe openai-batch file is not a training format: it holds only each conversation's last answer, without the request's messages; neither SpecForge nor speculators reads it (they need `conversations`).\n")
	}
	fmt.Fprintf(&b, "\nChecksums of every file are in `%s.manifest.json`; `regen verify` checks them and every record against the store.\n", m.Job.Name)
	fmt.Fprintf(&b, "\nBuilt with regen %s.\n", m.RegenVersion)
	return []byte(b.String())
}

// trainingFiles are the training files: format and path, the ShareGPT
// JSONL first (the trainers read it).
func trainingFiles(m *Manifest) [][2]string {
	var out [][2]string
	for _, f := range []string{FormatShareGPT, FormatParquet} {
		for _, mf := range m.Files {
			if mf.Format == f {
				out = append(out, [2]string{f, mf.Path})
			}
		}
	}
	return out
}

// trainingConfigs are the card's configs: the first training file only.
// datasets builds every config of a card with the one builder it infers
// from the first config's files (load.py LocalDatasetModuleFactory
// .get_module, docs/training-data.md), so a JSON and a Parquet config
// cannot share a card: the second would be read with the first's reader.
func trainingConfigs(m *Manifest) [][2]string {
	return trainingFiles(m)[:min(1, len(trainingFiles(m)))]
}

func yamlList(b *strings.Builder, key string, values ...string) {
	if len(values) == 0 {
		return
	}
	b.WriteString(key + ":\n")
	for _, v := range values {
		b.WriteString("  - " + strconv.Quote(v) + "\n")
	}
}

func cardFrontMatter(b *strings.Builder, m *Manifest) {
	b.WriteString("---\n# " + CardMarker + " by regen at every export; remove this line to keep your own edits.\n")
	fmt.Fprintf(b, "pretty_name: %s\n", strconv.Quote(cmp.Or(m.Job.PrettyName, m.Job.Name)))
	fmt.Fprintf(b, "license: %s\n", strconv.Quote(cmp.Or(m.Job.License, LicenseUnset)))
	yamlList(b, "language", m.Job.Language...)
	yamlList(b, "annotations_creators", "machine-generated")
	yamlList(b, "source_datasets", m.Job.SourceDatasets...)
	yamlList(b, "size_categories", sizeCategory(m.Totals.Done))
	yamlList(b, "task_categories", "text-generation")
	yamlList(b, "tags", "synthetic", "regen")
	b.WriteString("configs:\n")
	for i, c := range trainingConfigs(m) {
		fmt.Fprintf(b, "  - config_name: %s\n", c[0])
		if i == 0 {
			b.WriteString("    default: true\n")
		}
		fmt.Fprintf(b, "    data_files:\n      - split: train\n        path: %s\n", strconv.Quote(c[1]))
	}
	b.WriteString("---\n\n")
}

// servedModels are the model ids the servers answered with.
func servedModels(m *Manifest) []string {
	var out []string
	for _, s := range m.Servers {
		for _, id := range s.Models {
			if !slices.Contains(out, id) {
				out = append(out, id)
			}
		}
	}
	slices.Sort(out)
	return out
}

func cardIntro(b *strings.Builder, m *Manifest) {
	fmt.Fprintf(b, "# %s\n\n", cmp.Or(m.Job.PrettyName, m.Job.Name))
	models := servedModels(m)
	named := "`" + strings.Join(models, "`, `") + "`"
	if len(models) == 0 {
		named = "`" + m.Job.Model + "` (no stored answer names the model it came from)"
	} else if len(models) > 1 || models[0] != m.Job.Model {
		named += fmt.Sprintf(" (the job asked for `%s`; this is the model id the servers answered with)", m.Job.Model)
	}
	fmt.Fprintf(b, "Synthetic conversations whose assistant turns were regenerated by the model %s", named)
	if e := servedBy(m); e != "" {
		fmt.Fprintf(b, ", served by %s", e)
	}
	fmt.Fprintf(b, ", exported %s by [regen](https://github.com/regen-dev/regen).\n", m.ExportedAt.UTC().Format("2006-01-02 15:04 UTC"))
	b.WriteString("Every row is one accepted sample; rejected samples and dead letters are in the files listed below, not in the training split.\n")
	fmt.Fprintf(b, "The full configuration, the servers, token statistics and SHA-256 checksums are in `%s.manifest.json`.\n\n", m.Job.Name)
	if m.Job.License == "" {
		b.WriteString("**License:** none given in the job (`output.license`), so the metadata says `other`: the terms of the source datasets and of the model that wrote the answers apply.\n\n")
	} else {
		fmt.Fprintf(b, "**License:** `%s`, as the job's `output.license` states; the terms of the source datasets and of the model still apply.\n\n", m.Job.License)
	}
}

// servedBy names the engines and versions the servers reported, else the
// manifest's engine.
func servedBy(m *Manifest) string {
	var names []string
	for _, s := range m.Servers {
		n := strings.TrimSpace(s.Engine + " " + s.EngineVersion)
		if n != "" && !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return m.Job.Engine
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
