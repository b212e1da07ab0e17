package job

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Fingerprint is the canonical form of everything in a job that can change
// what an answer would be, and its SHA-256. A store keeps the fingerprint of
// the configuration its answers were generated with, so a re-run with a
// different one is refused instead of mixing two configurations in one
// dataset.
//
// In: the model, the generation settings (temperature, top_p,
// chat_template_kwargs, extra, reasoning), each lane's max_tokens and the
// lane it escalates to, which lane each partition's samples go to, each
// source's field mapping, system-prompt handling and regenerate mode, and
// the quality rules that decide acceptance. Out: what cannot change an
// answer: concurrency, backups, endpoints, the launched server's flags (the
// served model and engine version are checked and recorded per answer
// instead), timeouts, retries, store, output, alerts and monitor settings,
// and the sources' paths and limits.
//
// Canonical is JSON with sorted keys and no insignificant space, so the
// order of keys in the job file never matters, and it holds no path, so it
// is the same on every host. A setting at its default (unset temperature,
// an empty mapping field) is left out, so an option added in a later regen
// at its default leaves existing fingerprints as they were.
type Fingerprint struct {
	Hash      string // hex SHA-256 of Canonical
	Canonical []byte
}

// Fingerprint computes the job's configuration fingerprint.
func (s *Spec) Fingerprint() (Fingerprint, error) {
	return fingerprintFrom(s.answerConfig(fingerprintVersion))
}

// LegacyFingerprint is the fingerprint regen computed for this job before
// the current form (samples_per_prompt was left out until version 2);
// ok is false when it is the same as Fingerprint's. A store whose
// generation has it holds answers of this very configuration.
func (s *Spec) LegacyFingerprint() (fp Fingerprint, ok bool, err error) {
	cur, err := s.Fingerprint()
	if err != nil {
		return Fingerprint{}, false, err
	}
	old, err := fingerprintFrom(s.answerConfig(1))
	if err != nil || old.Hash == cur.Hash {
		return Fingerprint{}, false, err
	}
	return old, true, nil
}

// fingerprintVersion is the form answerConfig builds: 2 adds each
// source's samples_per_prompt (k answers per prompt, each with its seed).
const fingerprintVersion = 2

func fingerprintFrom(cfg map[string]any) (Fingerprint, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // "</s>" stays readable in the stored form
	if err := enc.Encode(cfg); err != nil {
		return Fingerprint{}, fmt.Errorf("configuration fingerprint: %w", err)
	}
	// Maps are encoded with sorted keys at every level, and values decoded
	// from YAML are plain maps, lists and scalars, so b is canonical.
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	sum := sha256.Sum256(b)
	return Fingerprint{Hash: hex.EncodeToString(sum[:]), Canonical: b}, nil
}

// answerConfig gathers what can change an answer, keyed by the names the
// job file uses, so a difference reads as the field to look at; version
// is the form (fingerprintVersion, or an earlier one).
func (s *Spec) answerConfig(version int) map[string]any {
	cfg := map[string]any{}
	putStr(cfg, "model", s.Model)
	putMap(cfg, "generation", s.Generation.answerConfig())

	lanes := map[string]any{}
	for _, l := range s.Lanes {
		lc := map[string]any{"max_tokens": l.MaxTokens}
		if esc, ok := s.EscalationLane(l.Name); ok {
			lc["escalate_to"] = esc
		}
		lanes[l.Name] = lc
	}
	putMap(cfg, "lanes", lanes)

	sources := map[string]any{}
	laneOf := map[string]any{}
	for _, src := range s.Sources {
		m := map[string]any{}
		for _, f := range [][2]string{
			{"conversations", src.Conversations}, {"messages", src.Messages}, {"prompt", src.Prompt},
			{"system", src.System}, {"system_field", src.SystemField}, {"strip_system_prefix", src.StripSystemPrefix},
			{"tools", src.Tools}, {"id", src.ID}, {"regenerate", src.Regenerate},
		} {
			putStr(m, f[0], f[1])
		}
		if version >= 2 && src.SamplesPerPrompt > 1 {
			m["samples_per_prompt"] = src.SamplesPerPrompt
		}
		sources[src.Partition] = m
		laneOf[src.Partition] = laneSteps(s.LaneRanges(src.Partition))
	}
	putMap(cfg, "sources", sources)
	putMap(cfg, "lane_of", laneOf)
	putMap(cfg, "quality", s.Quality.answerConfig())
	return cfg
}

// RebuiltSources lists the partitions whose source entry differs between
// two canonical configurations (mapping, system prompt, tools, id field,
// regenerate, samples_per_prompt): the request bodies stored from their
// rows are not the ones the new configuration sends. A partition only the
// new one has is not listed (nothing of it is stored).
func RebuiltSources(from, to []byte) ([]string, error) {
	var a, b struct {
		Sources map[string]json.RawMessage `json:"sources"`
	}
	if len(from) > 0 {
		if err := json.Unmarshal(from, &a); err != nil {
			return nil, fmt.Errorf("stored configuration: %w", err)
		}
	}
	if err := json.Unmarshal(to, &b); err != nil {
		return nil, fmt.Errorf("job configuration: %w", err)
	}
	var out []string
	for p, old := range a.Sources {
		if cur, ok := b.Sources[p]; ok && !bytes.Equal(old, cur) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out, nil
}

// answerConfig is the generation settings sent with every request, and
// what happens to thinking.
func (g Generation) answerConfig() map[string]any {
	m := map[string]any{}
	if g.Temperature != nil {
		m["temperature"] = *g.Temperature
	}
	if g.TopP != nil {
		m["top_p"] = *g.TopP
	}
	if len(g.ChatTemplateKwargs) > 0 {
		m["chat_template_kwargs"] = g.ChatTemplateKwargs
	}
	if len(g.Extra) > 0 {
		m["extra"] = g.Extra
	}
	putStr(m, "reasoning", g.Reasoning)
	return m
}

// answerConfig is the quality rules that decide acceptance; regex rules
// are keyed by name (their order only decides which name a reject gets).
func (q Quality) answerConfig() map[string]any {
	m := map[string]any{
		"truncated": q.Truncated, "empty": q.Empty, "reasoning": q.Reasoning, "think_tags": q.ThinkTags,
		"tool_args": q.ToolArgs, "tool_name": q.ToolName,
		"repetition": map[string]any{"ngram": q.Repetition.NGram, "max_repeats": q.Repetition.MaxRepeats},
	}
	if len(q.Regex) > 0 {
		rx := map[string]any{}
		for _, r := range q.Regex {
			rx[r.Name] = map[string]any{"pattern": r.Pattern, "field": r.Field}
		}
		m["regex"] = rx
	}
	return m
}

// laneSteps is a partition's lane assignment: the lane's name when every
// sample goes to one lane, else the list of ranges.
func laneSteps(rs []LaneRange) any {
	if len(rs) == 1 {
		return rs[0].Lane
	}
	out := make([]any, len(rs))
	for i, r := range rs {
		step := map[string]any{"lane": r.Lane}
		if r.MaxTokens > 0 {
			step["up_to"] = r.MaxTokens
		}
		out[i] = step
	}
	return out
}

func putStr(m map[string]any, k, v string) {
	if v != "" {
		m[k] = v
	}
}

func putMap(m map[string]any, k string, v map[string]any) {
	if len(v) > 0 {
		m[k] = v
	}
}

// LaneRange is one step of a partition's lane assignment: its samples
// whose estimated prompt tokens are in [MinTokens, MaxTokens] (MaxTokens 0
// = no upper bound) go to Lane.
type LaneRange struct {
	Partition            string
	MinTokens, MaxTokens int
	Lane                 string
}

// LaneRanges is LaneFor for one partition as ranges of prompt tokens, in
// order, adjacent ranges of one lane merged. LaneFor is a step function of
// the prompt tokens whose steps are the lanes' max_prompt_tokens.
func (s *Spec) LaneRanges(partition string) []LaneRange {
	var bounds []int
	for _, l := range s.Lanes {
		if l.MaxPromptTokens > 0 {
			bounds = append(bounds, l.MaxPromptTokens)
		}
	}
	slices.Sort(bounds)
	bounds = slices.Compact(bounds)
	var out []LaneRange
	lo := 0
	add := func(hi int, lane string) {
		if n := len(out); n > 0 && out[n-1].Lane == lane {
			out[n-1].MaxTokens = hi
		} else {
			out = append(out, LaneRange{Partition: partition, MinTokens: lo, MaxTokens: hi, Lane: lane})
		}
	}
	for _, b := range bounds {
		add(b, s.LaneFor(partition, b))
		lo = b + 1
	}
	add(0, s.LaneFor(partition, lo))
	return out
}

// ConfigDiff lists the differences between two canonical configurations,
// one line per field, as "generation.temperature: 0.7 -> 1.3"; a field
// only one side has reads "(unset)" on the other. The lines are sorted by
// field.
func ConfigDiff(from, to []byte) ([]string, error) {
	a, err := flatConfig(from)
	if err != nil {
		return nil, fmt.Errorf("stored configuration: %w", err)
	}
	b, err := flatConfig(to)
	if err != nil {
		return nil, fmt.Errorf("job configuration: %w", err)
	}
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var out []string
	for _, k := range keys {
		va, oka := a[k]
		vb, okb := b[k]
		if oka && okb && va == vb {
			continue
		}
		if !oka {
			va = "(unset)"
		}
		if !okb {
			vb = "(unset)"
		}
		va, vb = clipPair(va, vb)
		out = append(out, fmt.Sprintf("%s: %s -> %s", k, va, vb))
	}
	return out, nil
}

// flatConfig maps every leaf of a canonical configuration to its value
// as text, keyed by its path (a.b, a.list[0].c).
func flatConfig(canonical []byte) (map[string]string, error) {
	out := map[string]string{}
	if len(canonical) == 0 {
		return out, nil
	}
	dec := json.NewDecoder(bytes.NewReader(canonical))
	dec.UseNumber() // numbers as written: 0.7 stays 0.7
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	flatten(out, "", v)
	return out, nil
}

func flatten(out map[string]string, path string, v any) {
	switch x := v.(type) {
	case map[string]any:
		if len(x) == 0 && path != "" {
			out[path] = "{}"
		}
		for k, e := range x {
			p := k
			if path != "" {
				p = path + "." + k
			}
			flatten(out, p, e)
		}
	case []any:
		if len(x) == 0 {
			out[path] = "[]"
		}
		for i, e := range x {
			flatten(out, fmt.Sprintf("%s[%d]", path, i), e)
		}
	case string:
		if x == "" || strings.ContainsAny(x, " \t\n\"") {
			b, _ := json.Marshal(x)
			out[path] = string(b)
		} else {
			out[path] = x
		}
	default:
		b, _ := json.Marshal(x)
		out[path] = string(b)
	}
}
