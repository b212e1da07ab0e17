package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// CaptureRowsBeforeServerPath are inserts (plain SQL both backends take)
// of a capture in every state into a captures table as it was before
// server_path: pending after a failure, leased by a killed worker whose
// lease ended, captured, dead.
var CaptureRowsBeforeServerPath = []string{
	`INSERT INTO captures (key, sample_id, turn, state, attempts, last_error, input_sha256) VALUES ('p', 'p', -1, 'pending', 1, 'nan: x', 'i')`,
	`INSERT INTO captures (key, sample_id, turn, state, owner, lease_until, token, input_sha256) VALUES ('l', 'l', -1, 'leased', 'w0', 1, 3, 'i')`,
	`INSERT INTO captures (key, sample_id, turn, state, token, path, bytes, sha256, tokens, layers, hidden, dtype, captured_at, input_sha256)
		VALUES ('d', 'd', -1, 'done', 1, 'h/d.safetensors', 4096, 'ab12', 17, 3, 64, 'BF16', 1, 'i')`,
	`INSERT INTO captures (key, sample_id, turn, state, attempts, last_error, input_sha256) VALUES ('x', 'x', -1, 'dead', 3, 'truncated: y', 'i')`,
}

// CheckCapturesAfterServerPath checks a store upgraded from
// CaptureRowsBeforeServerPath: every row keeps its state, none hands on a
// server path, and a path noted now is handed on.
func CheckCapturesAfterServerPath(t *testing.T, s store.Store) {
	t.Helper()
	ctx := context.Background()
	wantCaptureStates(t, s, []string{"p", "l", "d", "x"}, map[string]store.State{
		"p": store.Pending, "l": store.Leased, "d": store.Done, "x": store.Dead})
	key := func(k string) store.CaptureKey { return store.CaptureKey{Key: k, SampleID: k, Turn: -1, Input: "i"} }
	for _, k := range []string{"d", "x"} {
		if _, ok := claimCapture(t, s, key(k), "w1", lease); ok {
			t.Errorf("upgraded %s row claimed again for its own input", k)
		}
	}
	p := claimServerPath(t, s, key("p"), "w1", "")
	if p.Attempts != 1 || p.LastError != "nan: x" {
		t.Errorf("upgraded pending row claimed as %+v, want its attempt and evidence kept", p)
	}
	l := claimServerPath(t, s, key("l"), "w1", "")
	if l.Token != 4 {
		t.Errorf("upgraded leased row claimed with token %d, want 4", l.Token)
	}
	must(t, s.NoteCaptureServerPath(ctx, l, "/srv/out/r.safetensors"))
	_, err := s.ReleaseCaptures(ctx, "")
	must(t, err)
	claimServerPath(t, s, key("l"), "w2", "/srv/out/r.safetensors")
	var files []store.CapturedFile
	must(t, s.EachCapturedFile(ctx, func(f store.CapturedFile) error { files = append(files, f); return nil }))
	if len(files) != 1 || files[0].Key != "d" || files[0].Path != "h/d.safetensors" || !files[0].CapturedAt.Equal(time.Unix(0, 1)) {
		t.Errorf("captured files after the upgrade = %+v, want d's", files)
	}
}
