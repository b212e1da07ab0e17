package conversation

import (
	"encoding/json"
	"testing"
)

// ShapeOf reads the shared prefix (as SharedPrefix), its size as text
// (one byte less per JSON escape) and the plan's number of turns.
func TestShapeOf(t *testing.T) {
	sys := `{"name": "fn", "description": "line one` + "\n" + `line two"}`
	b := &Body{
		Messages: []Message{{Role: "system", Content: mustJSON(t, sys)}, {Role: "user", Content: mustJSON(t, "hi")}},
		Turns:    []Turn{{Input: []Message{{Role: "user", Content: mustJSON(t, "more")}}}, {Input: []Message{{Role: "user", Content: mustJSON(t, "again")}}}},
	}
	body := Encode(b)
	sh := ShapeOf(body)
	key, size := SharedPrefix(body)
	if sh.PrefixKey != key || sh.PrefixBytes != size || key == 0 {
		t.Errorf("shape %+v, SharedPrefix %d %d: want the same non-zero key and size", sh, key, size)
	}
	if want := len(sys) + 2; sh.PrefixText != want { // the text and its two quotes
		t.Errorf("prefix text %d bytes (stored %d), want %d", sh.PrefixText, sh.PrefixBytes, want)
	}
	if sh.Turns != 3 {
		t.Errorf("turns %d, want 3", sh.Turns)
	}
	if got := ShapeOf([]byte("not json")); got != (Shape{}) {
		t.Errorf("shape of a bad body %+v, want zero", got)
	}
	if got := ShapeOf(Encode(&Body{Messages: []Message{{Role: "user", Content: mustJSON(t, "q")}}})); got.Turns != 1 || got.PrefixKey != 0 {
		t.Errorf("single-turn body without a system prompt: %+v, want 1 turn, no prefix", got)
	}
}

func mustJSON(t *testing.T, s string) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
