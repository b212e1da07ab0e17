package fleet

import (
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/job"
)

func TestProgressTimeout(t *testing.T) {
	tests := []struct {
		name string
		spec job.Spec
		want time.Duration
	}{
		{"endpoints: half hang_after", job.Spec{Monitor: job.Monitor{HangAfter: 30 * time.Second}, Generation: job.Generation{IdleTimeout: 120 * time.Second}}, 15 * time.Second},
		{"launched server: half its hang_timeout", job.Spec{Server: &job.Server{HangTimeout: 60 * time.Second}, Monitor: job.Monitor{HangAfter: 30 * time.Second}, Generation: job.Generation{IdleTimeout: 120 * time.Second}}, 30 * time.Second},
		{"an idle timeout below it", job.Spec{Monitor: job.Monitor{HangAfter: 30 * time.Second}, Generation: job.Generation{IdleTimeout: 10 * time.Second}}, 10 * time.Second},
		{"nothing set: half the default hang", job.Spec{}, job.DefaultHangAfter / 2},
	}
	for _, tt := range tests {
		if got := ProgressTimeout(&tt.spec); got != tt.want {
			t.Errorf("%s: ProgressTimeout = %v, want %v", tt.name, got, tt.want)
		}
	}
}
