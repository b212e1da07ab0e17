package dispatch

import (
	"fmt"
	"testing"

	"github.com/regen-dev/regen/internal/llm"
)

// TestStreakErrorKeepsEndpointFault: when the streak stops the run because
// every sample left was refused (exhausted, not the streak's count), the
// reason still says the endpoint is not the API, as a tripped streak does:
// under load the deferred samples made the run end this way and lose the
// "check its url" advice.
func TestStreakErrorKeepsEndpointFault(t *testing.T) {
	tests := []struct {
		name      string
		err       error
		wantFault bool
	}{
		{"not the API", &llm.Error{Class: llm.Malformed, EndpointFault: true, Msg: "chat: answered 200 with a JSON body"}, true},
		{"a refusal", &llm.Error{Class: llm.BadRequest, Status: 400, Msg: "unknown field"}, false},
		{"wrapped", fmt.Errorf("send: %w", &llm.Error{Class: llm.Malformed, EndpointFault: true, Msg: "web page"}), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newPoisonGuard(8)
			if g.streakError(nil) != nil {
				t.Fatal("a guard with no streak gave a reason to stop")
			}
			for i := range 3 {
				g.badRequest(fmt.Sprint("s", i), tt.err, "http://e")
			}
			pe := g.streakError(nil)
			if pe == nil || pe.Samples != 3 || pe.EndpointFault != tt.wantFault || pe.Endpoint != "http://e" {
				t.Fatalf("streakError = %+v; want 3 samples from http://e, endpoint fault %v", pe, tt.wantFault)
			}
		})
	}
}
