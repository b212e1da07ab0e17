package sim

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Profile names a set of the cost model's step times: what one decode step
// and one prefill batch cost in simulated time. docs/engines.md (the
// simulator's cost model) gives the measurements behind each and the
// arithmetic.
type Profile struct {
	Name             string
	DecodeBase       time.Duration
	DecodePerReq     time.Duration
	DecodePerKToken  time.Duration
	PrefillBase      time.Duration
	PrefillPerKToken time.Duration
}

// The profiles' names.
const (
	// ProfileCalibrated is the default: one 8 x H200 node serving a
	// DeepSeek-V3/R1-class MoE (37B active) with SGLang or vLLM, fitted to
	// published single-node serving benchmarks: prefill about 20,000 tokens
	// per second, a decode step of 19 ms plus 0.056 ms per running request
	// plus 0.027 ms per thousand KV tokens in use.
	ProfileCalibrated = "calibrated"
	// ProfileFast is the simulator's timing before calibration (prefill
	// 50,000 tokens per second): cheap prefill, kept for tests whose
	// timings were written against it.
	ProfileFast = "fast"
)

// profiles lists every profile, the default first.
var profiles = []Profile{
	{Name: ProfileCalibrated,
		DecodeBase: 19 * time.Millisecond, DecodePerReq: 56 * time.Microsecond, DecodePerKToken: 27 * time.Microsecond,
		PrefillBase: 20 * time.Millisecond, PrefillPerKToken: 50 * time.Millisecond},
	{Name: ProfileFast,
		DecodeBase: 15 * time.Millisecond, DecodePerReq: 150 * time.Microsecond, DecodePerKToken: 50 * time.Microsecond,
		PrefillBase: 5 * time.Millisecond, PrefillPerKToken: 20 * time.Millisecond},
}

// LookupProfile returns the named profile.
func LookupProfile(name string) (Profile, error) {
	names := make([]string, 0, len(profiles))
	for _, p := range profiles {
		if p.Name == name {
			return p, nil
		}
		names = append(names, p.Name)
	}
	return Profile{}, fmt.Errorf("profile %q: want %s", name, strings.Join(names, " or "))
}

// UseProfile sets c's step times from the named profile.
func (c *Config) UseProfile(name string) error {
	p, err := LookupProfile(name)
	if err != nil {
		return err
	}
	c.setProfile(p)
	return nil
}

func (c *Config) setProfile(p Profile) {
	c.Profile = p.Name
	c.DecodeBase, c.DecodePerReq, c.DecodePerKToken = p.DecodeBase, p.DecodePerReq, p.DecodePerKToken
	c.PrefillBase, c.PrefillPerKToken = p.PrefillBase, p.PrefillPerKToken
}

// profileValue is the --profile flag. It sets only the step times whose own
// flags were not given, so an explicit knob wins whatever the order on the
// command line (or in a job file's sim block, which is applied sorted).
type profileValue struct {
	c  *Config
	fs *pflag.FlagSet
}

func (v profileValue) String() string {
	if v.c == nil {
		return ""
	}
	return v.c.Profile
}

func (v profileValue) Type() string { return "string" }

func (v profileValue) Set(s string) error {
	p, err := LookupProfile(strings.TrimSpace(s))
	if err != nil {
		return err
	}
	v.c.Profile = p.Name
	for _, k := range []struct {
		flag string
		dst  *time.Duration
		val  time.Duration
	}{
		{"decode-base", &v.c.DecodeBase, p.DecodeBase},
		{"decode-per-req", &v.c.DecodePerReq, p.DecodePerReq},
		{"decode-per-ktoken", &v.c.DecodePerKToken, p.DecodePerKToken},
		{"prefill-base", &v.c.PrefillBase, p.PrefillBase},
		{"prefill-per-ktoken", &v.c.PrefillPerKToken, p.PrefillPerKToken},
	} {
		if !v.fs.Changed(k.flag) {
			*k.dst = k.val
		}
	}
	return nil
}

// registerProfileFlag binds --profile, the named set of step times.
func registerProfileFlag(fs *pflag.FlagSet, c *Config) {
	fs.Var(profileValue{c, fs}, "profile", "step times: calibrated (8 x H200 serving a DeepSeek-V3-class MoE, from published benchmarks; docs/engines.md) or fast (cheap prefill, for tests); the --decode-* and --prefill-* flags override it")
}
