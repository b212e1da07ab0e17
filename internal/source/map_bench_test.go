package source

import (
	"testing"

	"github.com/regen-dev/regen/internal/job"
)

// BenchmarkMapRow maps one decoded row to a sample (body written, id
// hashed): the CPU and allocations per row of the mapping, without the
// file reading and JSON decoding around it.
func BenchmarkMapRow(b *testing.B) {
	cases := []struct {
		name string
		src  job.Source
		row  string
	}{
		{"prompt", job.Source{Partition: "P", Prompt: "q"},
			`{"q":"Please explain binary search trees in simple terms, with one example. Request number 12345."}`},
		{"sharegpt", job.Source{Partition: "S", Conversations: "c", ID: "id"},
			`{"id":"row-1","c":[{"from":"system","value":"You are a careful assistant."},{"from":"human","value":"Please explain <trees> & graphs in simple terms."},` +
				`{"from":"gpt","value":"Sure: here is a short explanation."},{"from":"human","value":"And an example?"},{"from":"gpt","value":"Here is one."}]}`},
		{"glaive", job.Source{Partition: "G", Conversations: "c", Tools: "tools", SystemField: "sys", StripSystemPrefix: "SYSTEM:"},
			`{"sys":"SYSTEM: You can call functions.","tools":"[{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}]",` +
				`"c":[{"from":"human","value":"Weather in Oslo?"},{"from":"function_call","value":"{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}"},` +
				`{"from":"observation","value":"{\"temp\":3}"},{"from":"gpt","value":"It is 3 degrees."}]}`},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var d decoder
			m := newMapper(c.src)
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				row, reason := d.object([]byte(c.row))
				if reason != "" {
					b.Fatal(reason)
				}
				b.StartTimer()
				if _, rerr := m.sample(row, "o"); rerr != nil {
					b.Fatal(rerr)
				}
			}
		})
	}
}
