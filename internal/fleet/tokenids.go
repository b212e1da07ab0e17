package fleet

import (
	"context"
	"fmt"

	"github.com/regen-dev/regen/internal/store"
)

// ObserveAnswer learns from each answer whether url returns the token ids
// the job asks for (output.token_ids). The first answer without them is
// told at once, in the log, the store's events (what status and the views
// read) and the terminal's notes, rather than at the export's end, when a
// whole dataset had been generated without them. Once per endpoint.
func (f *Fleet) ObserveAnswer(url string, tokenIDs bool) {
	if tokenIDs || !f.cfg.Spec.Output.TokenIDs {
		return
	}
	f.mu.Lock()
	told := f.toldNoIDs[url] // told already at identification (tellNoTokenIDs)
	f.toldNoIDs[url] = true
	f.mu.Unlock()
	if told {
		return
	}
	d, _ := f.Engine(url)
	ev := fmt.Sprintf("output.token_ids is on, but the first answer from %s (%s) came without token ids: its records will export token_ids: unavailable", url, d.Name)
	f.log.Warn("answer without token ids", "endpoint", url, "engine", d.Name, "asked_with", d.TokenIDFields)
	f.event(context.Background(), store.Event{Kind: "token_ids", Subject: url, Evidence: ev})
	f.note("regen: " + ev)
}
