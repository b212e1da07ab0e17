package plan

import (
	"strings"
	"testing"
)

// TestHeadline: lanes asking for more requests than the KV pool holds get
// the figure first, with the options; lanes that fit get no headline. A
// refused plan prints no server section to copy; one that works does.
func TestHeadline(t *testing.T) {
	tests := []struct {
		name      string
		lanes     []Lane
		hicacheGB int
		want      []string // the headline's lines, in order ("" : none)
		server    bool
	}{
		{"fits", []Lane{{Name: "short", Concurrency: 4, MaxTokens: 4096}}, 30, nil, true},
		{"short of KV", []Lane{{Name: "short", Concurrency: 150, MaxTokens: 10240}, {Name: "long", Concurrency: 32, MaxTokens: 16384}}, 30,
			[]string{"KV fits ~40 of the 182 requests you asked for (short 150, long 32; planned short 33, long 7). Options:",
				"run with what fits: lane concurrency short 33, long 7", "lower max_tokens", "--kv-cache-dtype fp8_e4m3", "more GPUs"}, true},
		{"refused", []Lane{{Name: "short", Concurrency: 4, MaxTokens: 4096}}, 300, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := kimiInput(t)
			in.HiCache = HiCache{Enabled: true, SizeGB: tt.hicacheGB}
			in.Lanes = tt.lanes
			in.PromptTokens, in.OutputTokens = 1500, 4000
			p, err := Compute(in)
			if p == nil {
				t.Fatalf("Compute: %v", err)
			}
			if len(p.Headline) != len(tt.want) {
				t.Fatalf("headline %q, want %d lines", p.Headline, len(tt.want))
			}
			for i, w := range tt.want {
				if !strings.Contains(p.Headline[i], w) {
					t.Errorf("headline line %d = %q, want %q in it", i, p.Headline[i], w)
				}
			}
			var b strings.Builder
			if err := p.WriteText(&b); err != nil {
				t.Fatal(err)
			}
			text := b.String()
			if len(tt.want) > 0 && !strings.HasPrefix(strings.SplitN(text, "\n", 4)[2], "KV fits ~") {
				t.Errorf("the shortfall is not the plan's first statement:\n%s", text[:min(len(text), 600)])
			}
			if got := strings.Contains(text, "\nserver:\n  engine:"); got != tt.server {
				t.Errorf("server section printed = %v, want %v (refusals %d)", got, tt.server, len(p.Refusals))
			}
			if !tt.server && !strings.Contains(text, "no server section to copy: the plan is refused") {
				t.Errorf("a refused plan does not say why it has no server section")
			}
		})
	}
}
