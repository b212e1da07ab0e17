package job

import (
	"cmp"
	"slices"
)

// Lane returns the lane called name.
func (s *Spec) Lane(name string) (Lane, bool) {
	for _, l := range s.Lanes {
		if l.Name == name {
			return l, true
		}
	}
	return Lane{}, false
}

// LaneFor assigns a sample to a lane. The first rule that matches wins: the
// source's own lane, a lane listing the partition, the first lane whose
// max_prompt_tokens admits promptTokens, the first lane with no rules, and
// finally the first lane. It returns "" only when there are no lanes.
func (s *Spec) LaneFor(partition string, promptTokens int) string {
	for _, src := range s.Sources {
		if src.Partition == partition && src.Lane != "" {
			return src.Lane
		}
	}
	for _, l := range s.Lanes {
		if slices.Contains(l.Partitions, partition) {
			return l.Name
		}
	}
	for _, l := range s.Lanes {
		if l.MaxPromptTokens > 0 && promptTokens <= l.MaxPromptTokens {
			return l.Name
		}
	}
	for _, l := range s.Lanes {
		if len(l.Partitions) == 0 && l.MaxPromptTokens == 0 {
			return l.Name
		}
	}
	if len(s.Lanes) > 0 {
		return s.Lanes[0].Name
	}
	return ""
}

// EscalationLane returns the lane a sample truncated in lane moves to: the
// lane with the smallest max_tokens greater than lane's. ok is false when
// lane is unknown or already the biggest.
func (s *Spec) EscalationLane(lane string) (string, bool) {
	cur, ok := s.Lane(lane)
	if !ok {
		return "", false
	}
	best, found := Lane{}, false
	for _, l := range s.Lanes {
		if l.MaxTokens > cur.MaxTokens && (!found || l.MaxTokens < best.MaxTokens) {
			best, found = l, true
		}
	}
	return best.Name, found
}

// BaseName is the job name made safe for file names (store and exports).
func (s *Spec) BaseName() string { return sanitizeName(s.Name) }

// EngineOf names the engine answering at url: an endpoint's engine, or
// the launched server's for any other URL (the server's address is known
// only once it runs). "" when the job does not say: an endpoint whose
// engine is detected from the server (Endpoint.Detect) or an unknown URL.
func (s *Spec) EngineOf(url string) string {
	for _, e := range s.Endpoints {
		if e.URL == url {
			if e.Engine == "" && e.Detect {
				return ""
			}
			return cmp.Or(e.Engine, "sglang")
		}
	}
	if s.Server != nil {
		return cmp.Or(s.Server.Engine, "sglang")
	}
	return ""
}
