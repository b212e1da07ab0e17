package monitor

import (
	"encoding/json"
	"reflect"
	"time"
)

// SchemaVersion is the version of the `regen status --json` document
// (docs/status-json.md). Adding a field keeps it; renaming, removing or
// changing the meaning or type of one bumps it.
const SchemaVersion = 1

// The JSON form of the report follows three rules, so every reader can rely
// on them: keys are snake_case; a time that is not known is null, never
// Go's zero time; a duration is written twice, as integer nanoseconds
// (`*_ns`) and as a number of seconds (`*_seconds`). Lists are [] when
// empty, never null, so fields added later follow the same shape.

// MarshalJSON writes the report in the documented schema.
func (r Report) MarshalJSON() ([]byte, error) {
	type plain Report
	p := plain(r)
	emptySlices(&p)
	var eta *time.Duration
	if r.ETA > 0 {
		eta = &r.ETA
	}
	// The fields declared here shadow plain's of the same name; the first
	// three are repeated only to keep them first in the document.
	return json.Marshal(struct {
		SchemaVersion int        `json:"schema_version"`
		Job           string     `json:"job"`
		Time          *time.Time `json:"time"`
		plain
		ETA        *time.Duration `json:"eta_ns"`
		ETASeconds *float64       `json:"eta_seconds"`
	}{SchemaVersion, r.Job, nullTime(r.Time), p, eta, seconds(eta)})
}

// MarshalJSON writes the heartbeat with null times and its age in seconds.
func (h HeartbeatInfo) MarshalJSON() ([]byte, error) {
	type plain HeartbeatInfo
	return json.Marshal(struct {
		Time    *time.Time `json:"time"`
		Started *time.Time `json:"started"`
		plain
		AgeSeconds float64 `json:"age_seconds"`
	}{nullTime(h.Time), nullTime(h.Started), plain(h), h.Age.Seconds()})
}

// MarshalJSON writes the rate with its window in seconds too.
func (r Rate) MarshalJSON() ([]byte, error) {
	type plain Rate
	return json.Marshal(struct {
		plain
		WindowSeconds float64 `json:"window_seconds"`
	}{plain(r), r.Window.Seconds()})
}

// MarshalJSON writes an endpoint with null for times not known. The same
// encoding is stored in the heartbeat; time.Time reads null back as zero.
func (e EndpointStatus) MarshalJSON() ([]byte, error) {
	type plain EndpointStatus
	p := plain(e)
	emptySlices(&p)
	return json.Marshal(struct {
		plain
		Since       *time.Time `json:"since"`
		LastTokenAt *time.Time `json:"last_token_at"`
	}{p, nullTime(e.Since), nullTime(e.LastTokenAt)})
}

// MarshalJSON writes the beat with null for a last token not yet seen.
func (b Beat) MarshalJSON() ([]byte, error) {
	type plain Beat
	return json.Marshal(struct {
		plain
		LastTokenAt *time.Time `json:"last_token_at"`
	}{plain(b), nullTime(b.LastTokenAt)})
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func seconds(d *time.Duration) *float64 {
	if d == nil {
		return nil
	}
	s := d.Seconds()
	return &s
}

// emptySlices replaces the nil slices among the fields of the struct that
// ptr points to with empty ones, so they encode as [] and not null.
func emptySlices(ptr any) {
	v := reflect.ValueOf(ptr).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		if f.Kind() == reflect.Slice && f.IsNil() && f.CanSet() {
			f.Set(reflect.MakeSlice(f.Type(), 0, 0))
		}
	}
}

// MarshalJSON writes a server load reading with null for a time not
// known, its age and interval in seconds too, and whether it is older than
// its interval.
func (l Load) MarshalJSON() ([]byte, error) {
	type plain Load
	_, stale := (&l).Stale()
	return json.Marshal(struct {
		At *time.Time `json:"at"`
		plain
		AgeSeconds   float64 `json:"age_seconds"`
		EverySeconds float64 `json:"probe_every_seconds"`
		Stale        bool    `json:"stale"`
	}{nullTime(l.At), plain(l), l.Age.Seconds(), l.Every.Seconds(), stale})
}
