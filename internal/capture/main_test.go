package capture

import (
	"testing"

	"github.com/regen-dev/regen/internal/store/postgres/pgtest"
)

// TestMain stops the PostgreSQL server a test started (pgtest.Get starts
// it on first use only).
func TestMain(m *testing.M) { pgtest.Main(m) }
