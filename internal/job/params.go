package job

import (
	"encoding/json"
	"fmt"
	"slices"
)

// Params returns the settings merged at the top level of every request
// body: generation.extra first, then temperature, top_p and
// chat_template_kwargs (validation forbids setting one in both places).
// With reasoning: disable, chat_template_kwargs also turns thinking off.
func (g Generation) Params() (map[string]json.RawMessage, error) {
	out := make(map[string]json.RawMessage, len(g.Extra)+3)
	put := func(k string, v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("generation %s: %w", k, err)
		}
		out[k] = b
		return nil
	}
	for _, k := range sortedKeys(g.Extra) {
		if err := put(k, g.Extra[k]); err != nil {
			return nil, err
		}
	}
	if g.Temperature != nil {
		if err := put("temperature", *g.Temperature); err != nil {
			return nil, err
		}
	}
	if g.TopP != nil {
		if err := put("top_p", *g.TopP); err != nil {
			return nil, err
		}
	}
	if g.ChatTemplateKwargs != nil {
		if err := put("chat_template_kwargs", g.ChatTemplateKwargs); err != nil {
			return nil, err
		}
	}
	if g.Reasoning == ReasoningDisable {
		// Both switches off, over whatever else the job sends in
		// chat_template_kwargs: each template reads only its own key.
		kw := map[string]any{}
		for k, v := range g.chatTemplateKwargs() {
			kw[k] = v
		}
		for _, k := range thinkingKeys {
			kw[k] = false
		}
		if err := put("chat_template_kwargs", kw); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
