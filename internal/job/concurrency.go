package job

import (
	"fmt"
	"slices"
	"strings"
)

// Auto is an adaptive lane limit (concurrency: auto): each endpoint gets its
// own limit for the lane, moved by a controller between Min and Max from the
// server's load. The dispatcher's limit package documents the controller.
type Auto struct {
	Min     int `json:"min"`     // lower bound per endpoint (default 1)
	Max     int `json:"max"`     // upper bound per endpoint; 0 = none but the server's own cap
	Initial int `json:"initial"` // starting limit per endpoint (default 4)
}

// Defaults of concurrency: auto.
const (
	DefaultAutoMin     = 1
	DefaultAutoInitial = 4
)

// ConcurrencyValue is a lane's concurrency as the job file writes it: a
// number, auto, or a mapping {auto, min, max, initial}. The shape check
// judges its form with the line of each mistake; applyDefaults resolves it
// into Lane.Concurrency or Lane.Auto.
type ConcurrencyValue struct{ raw any }

// UnmarshalYAML keeps the value as decoded.
func (v *ConcurrencyValue) UnmarshalYAML(unmarshal func(any) error) error {
	return unmarshal(&v.raw)
}

// concurrencyProblem is a bad concurrency value: the field path under the
// lane's concurrency ("" for the value itself) and what is wrong.
type concurrencyProblem struct{ field, msg string }

// resolveConcurrency turns the written concurrency into Concurrency or Auto;
// nothing written means the fixed default.
func (l *Lane) resolveConcurrency(written bool) {
	switch v := l.Written.raw.(type) {
	case nil:
		if !written && l.Concurrency == 0 && l.Auto == nil {
			l.Concurrency = DefaultConcurrency
		} else if written {
			l.problems = append(l.problems, concurrencyProblem{"", "empty: want a number, auto, or {auto: true, min, max, initial}"})
		}
	case string:
		if strings.EqualFold(strings.TrimSpace(v), "auto") {
			l.Auto = &Auto{}
		} else {
			l.problems = append(l.problems, concurrencyProblem{"", fmt.Sprintf("%q: want a number, auto, or {auto: true, min, max, initial}", v)})
		}
	case map[string]any:
		l.Auto = &Auto{}
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			switch k {
			case "auto":
				if b, ok := v[k].(bool); !ok || !b {
					l.problems = append(l.problems, concurrencyProblem{"auto", "a mapping sets an adaptive limit and needs auto: true (write a number for a fixed one)"})
				}
			case "min":
				l.Auto.Min = l.autoInt(k, v[k])
			case "max":
				l.Auto.Max = l.autoInt(k, v[k])
			case "initial":
				l.Auto.Initial = l.autoInt(k, v[k])
			default:
				l.problems = append(l.problems, concurrencyProblem{k, "unknown key (want auto, min, max, initial)"})
			}
		}
	default:
		if n, ok := toInt(v); ok {
			l.Concurrency = n
			if n <= 0 {
				l.problems = append(l.problems, concurrencyProblem{"", "must be > 0 (or auto)"})
			}
			return
		}
		l.problems = append(l.problems, concurrencyProblem{"", fmt.Sprintf("%v: want a number, auto, or {auto: true, min, max, initial}", v)})
	}
	if a := l.Auto; a != nil {
		if a.Min == 0 {
			a.Min = DefaultAutoMin
		}
		if a.Initial == 0 {
			a.Initial = max(DefaultAutoInitial, a.Min)
			if a.Max > 0 {
				a.Initial = min(a.Initial, a.Max)
			}
		}
	}
}

func (l *Lane) autoInt(key string, v any) int {
	n, ok := toInt(v)
	if !ok || n < 1 {
		l.problems = append(l.problems, concurrencyProblem{key, fmt.Sprintf("%v: want a whole number >= 1", v)})
		return 0
	}
	return n
}

// checkAuto reports bounds that contradict each other.
func (l *Lane) checkAuto() {
	a := l.Auto
	if a == nil {
		return
	}
	if a.Max > 0 && a.Max < a.Min {
		l.problems = append(l.problems, concurrencyProblem{"max", fmt.Sprintf("%d is below min %d", a.Max, a.Min)})
		return
	}
	if a.Initial < a.Min || (a.Max > 0 && a.Initial > a.Max) {
		l.problems = append(l.problems, concurrencyProblem{"initial", fmt.Sprintf("%d is outside min %d and max %d", a.Initial, a.Min, a.Max)})
	}
}

func toInt(v any) (int, bool) {
	switch n := v.(type) {
	case int:
		return n, true
	case int64:
		return int(n), true
	case uint64:
		return int(n), n <= 1<<31
	case float64:
		return int(n), n == float64(int(n))
	}
	return 0, false
}

// ConcurrencyText is the lane's limit as a job file would write it.
func (l Lane) ConcurrencyText() string {
	a := l.Auto
	switch {
	case a == nil:
		return fmt.Sprint(l.Concurrency)
	case a.Max > 0:
		return fmt.Sprintf("auto (%d..%d per endpoint, from %d)", a.Min, a.Max, a.Initial)
	default:
		return fmt.Sprintf("auto (>= %d per endpoint, from %d)", a.Min, a.Initial)
	}
}
