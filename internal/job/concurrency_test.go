package job

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const concurrencyJob = `name: c
sources:
  - {partition: p, path: p.jsonl, prompt: q}
endpoints:
  - url: http://127.0.0.1:30000
lanes:
  - name: l
    concurrency: %s
`

func parseConcurrency(t *testing.T, value string) (*Spec, error) {
	t.Helper()
	src := strings.Replace(concurrencyJob, "%s", value, 1)
	return Parse("job.yaml", []byte(src))
}

func TestConcurrencyForms(t *testing.T) {
	tests := []struct {
		value string
		fixed int
		auto  *Auto
		text  string
	}{
		{"150", 150, nil, "150"},
		{"auto", 0, &Auto{Min: 1, Initial: 4}, "auto (>= 1 per endpoint, from 4)"},
		{"AUTO", 0, &Auto{Min: 1, Initial: 4}, "auto (>= 1 per endpoint, from 4)"},
		{"{auto: true}", 0, &Auto{Min: 1, Initial: 4}, "auto (>= 1 per endpoint, from 4)"},
		{"{auto: true, min: 8, max: 400, initial: 16}", 0, &Auto{Min: 8, Max: 400, Initial: 16}, "auto (8..400 per endpoint, from 16)"},
		// Without auto: the mapping still means adaptive; the initial limit follows the bounds.
		{"{min: 10}", 0, &Auto{Min: 10, Initial: 10}, "auto (>= 10 per endpoint, from 10)"},
		{"{max: 2}", 0, &Auto{Min: 1, Max: 2, Initial: 2}, "auto (1..2 per endpoint, from 2)"},
	}
	for _, tt := range tests {
		s, err := parseConcurrency(t, tt.value)
		if err != nil {
			t.Errorf("concurrency: %s: %v", tt.value, err)
			continue
		}
		l := s.Lanes[0]
		if l.Concurrency != tt.fixed || !cmp.Equal(l.Auto, tt.auto) {
			t.Errorf("concurrency: %s = fixed %d, auto %+v; want %d, %+v", tt.value, l.Concurrency, l.Auto, tt.fixed, tt.auto)
		}
		if got := l.ConcurrencyText(); got != tt.text {
			t.Errorf("concurrency: %s text = %q, want %q", tt.value, got, tt.text)
		}
	}
	// Left out: the fixed default, exactly as before.
	s, err := Parse("job.yaml", []byte(strings.Replace(concurrencyJob, "    concurrency: %s\n", "", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if l := s.Lanes[0]; l.Concurrency != DefaultConcurrency || l.Auto != nil {
		t.Errorf("no concurrency = fixed %d, auto %+v; want %d, nil", l.Concurrency, l.Auto, DefaultConcurrency)
	}
}

func TestConcurrencyErrors(t *testing.T) {
	tests := []struct {
		value string
		want  []string
	}{
		{"0", []string{"job.yaml:8: lanes[0].concurrency: must be > 0 (or auto)"}},
		{"-3", []string{"job.yaml:8: lanes[0].concurrency: must be > 0 (or auto)"}},
		// The form is judged with the column, before anything is decoded.
		{"many", []string{`job.yaml:8:18: lanes[0].concurrency: want integer or auto, got string "many"`}},
		{`"150"`, []string{`job.yaml:8:18: lanes[0].concurrency: want integer or auto, got string "150" (write 150 without quotes)`}},
		{"2.5", []string{"job.yaml:8:18: lanes[0].concurrency: want integer, auto or a mapping {auto, min, max, initial}, got number 2.5"}},
		{"{auto: yes please}", []string{`job.yaml:8:25: lanes[0].concurrency.auto: want boolean (true or false), got string "yes please"`}},
		{"{auto: true, max: 1.5}", []string{`job.yaml:8:36: lanes[0].concurrency.max: want integer, got number 1.5`}},
		{"{auto: false, min: 4}", []string{"job.yaml:8: lanes[0].concurrency.auto: a mapping sets an adaptive limit and needs auto: true (write a number for a fixed one)"}},
		{"{auto: true, minimum: 4}", []string{`job.yaml:8:31: lanes[0].concurrency.minimum: unknown field "minimum" (want auto, min, max, initial)`}},
		{"{auto: true, maxx: 4}", []string{`job.yaml:8:31: lanes[0].concurrency.maxx: unknown field "maxx" (did you mean "max"?)`}},
		{"{auto: true, min: 0}", []string{"job.yaml:8: lanes[0].concurrency.min: 0: want a whole number >= 1"}},
		{"{auto: true, min: 50, max: 10}", []string{"job.yaml:8: lanes[0].concurrency.max: 10 is below min 50"}},
		{"{auto: true, max: 100, initial: 200}", []string{"job.yaml:8: lanes[0].concurrency.initial: 200 is outside min 1 and max 100"}},
	}
	for _, tt := range tests {
		_, err := parseConcurrency(t, tt.value)
		if diff := cmp.Diff(tt.want, errLines(err)); diff != "" {
			t.Errorf("concurrency: %s errors mismatch (-want +got):\n%s", tt.value, diff)
		}
	}
	// A block mapping points at the offending key's own line.
	src := strings.Replace(concurrencyJob, "%s", "\n      auto: true\n      max: 0", 1)
	_, err := Parse("job.yaml", []byte(src))
	if diff := cmp.Diff([]string{"job.yaml:10: lanes[0].concurrency.max: 0: want a whole number >= 1"}, errLines(err)); diff != "" {
		t.Errorf("block mapping errors mismatch (-want +got):\n%s", diff)
	}
}
