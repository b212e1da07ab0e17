package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
)

// steps lists a config's profile and step times in the flags' order.
func steps(c Config) []any {
	return []any{c.Profile, c.DecodeBase, c.DecodePerReq, c.DecodePerKToken, c.PrefillBase, c.PrefillPerKToken}
}

// TestDefaultIsCalibrated: the default config carries the calibrated
// profile's step times, and the fast profile today's earlier ones.
func TestDefaultIsCalibrated(t *testing.T) {
	want := []any{ProfileCalibrated, 19 * time.Millisecond, 56 * time.Microsecond, 27 * time.Microsecond, 20 * time.Millisecond, 50 * time.Millisecond}
	if diff := cmp.Diff(want, steps(DefaultConfig())); diff != "" {
		t.Errorf("DefaultConfig step times (-want +got):\n%s", diff)
	}
	c := DefaultConfig()
	if err := c.UseProfile(ProfileFast); err != nil {
		t.Fatal(err)
	}
	want = []any{ProfileFast, 15 * time.Millisecond, 150 * time.Microsecond, 50 * time.Microsecond, 5 * time.Millisecond, 20 * time.Millisecond}
	if diff := cmp.Diff(want, steps(c)); diff != "" {
		t.Errorf("fast profile (-want +got):\n%s", diff)
	}
	if err := c.UseProfile("slow"); err == nil || !strings.Contains(err.Error(), "calibrated or fast") {
		t.Errorf("UseProfile(slow) = %v, want an error naming the profiles", err)
	}
}

// TestProfileFlagYieldsToKnobs: an explicit step-time flag wins over
// --profile whether it comes before or after it, on the command line and
// in a job file's sim block (applied in sorted key order, decode_base first).
func TestProfileFlagYieldsToKnobs(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want []any
	}{
		{"profile alone", []string{"--profile", "fast"},
			[]any{ProfileFast, 15 * time.Millisecond, 150 * time.Microsecond, 50 * time.Microsecond, 5 * time.Millisecond, 20 * time.Millisecond}},
		{"knob before", []string{"--decode-base", "7ms", "--profile", "fast"},
			[]any{ProfileFast, 7 * time.Millisecond, 150 * time.Microsecond, 50 * time.Microsecond, 5 * time.Millisecond, 20 * time.Millisecond}},
		{"knob after", []string{"--profile=fast", "--prefill-per-ktoken", "80ms"},
			[]any{ProfileFast, 15 * time.Millisecond, 150 * time.Microsecond, 50 * time.Microsecond, 5 * time.Millisecond, 80 * time.Millisecond}},
		{"knob without profile", []string{"--prefill-base=1"},
			[]any{ProfileCalibrated, 19 * time.Millisecond, 56 * time.Microsecond, 27 * time.Microsecond, time.Second, 50 * time.Millisecond}},
	}
	for _, tc := range cases {
		c := DefaultConfig()
		fs := pflag.NewFlagSet("sim", pflag.ContinueOnError)
		RegisterFlags(fs, &c)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if diff := cmp.Diff(tc.want, steps(c)); diff != "" {
			t.Errorf("%s %q (-want +got):\n%s", tc.name, tc.args, diff)
		}
	}
	c := DefaultConfig()
	if err := c.Apply(map[string]any{"profile": "fast", "decode_per_req": "1ms", "speed": 5}); err != nil {
		t.Fatal(err)
	}
	want := []any{ProfileFast, 15 * time.Millisecond, time.Millisecond, 50 * time.Microsecond, 5 * time.Millisecond, 20 * time.Millisecond}
	if diff := cmp.Diff(want, steps(c)); diff != "" {
		t.Errorf("Apply sim block (-want +got):\n%s", diff)
	}
	if err := c.Apply(map[string]any{"profile": "slow"}); err == nil {
		t.Error("Apply(profile: slow) = nil error, want one")
	}
}
