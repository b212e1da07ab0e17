package sqlite

import (
	"strings"
	"testing"

	"github.com/regen-dev/regen/internal/store"
)

// TestSamplesQueryPlans pins the index each listing shape uses: a page of
// dead letters among 10^6 done samples must not walk the done ones.
func TestSamplesQueryPlans(t *testing.T) {
	s, _ := openTemp(t, Options{})
	for _, tc := range []struct {
		name string
		q    store.SampleQuery
		want string
	}{
		{"dead", store.SampleQuery{State: store.Dead}, "INDEX samples_dead (id>?)"},
		{"rejected in a partition", store.SampleQuery{State: store.Rejected, Partition: "A"}, "INDEX samples_"},
		{"partition", store.SampleQuery{Partition: "A"}, "INDEX samples_partition (partition=? AND id>?)"},
		{"done", store.SampleQuery{State: store.Done}, "INDEX samples_finished (id>?)"},
		{"leased", store.SampleQuery{State: store.Leased}, "INDEX samples_leased"},
		{"all", store.SampleQuery{}, "INDEX sqlite_autoindex_samples_1 (id>?)"},
	} {
		query, args, err := samplesQuery(tc.q)
		if err != nil {
			t.Fatal(err)
		}
		plan := explain(t, s.DB(), query, args...)
		if !strings.Contains(plan, tc.want) {
			t.Errorf("%s: plan %q does not contain %q", tc.name, plan, tc.want)
		}
		// Walking the leased partial index is bounded; walking samples is not.
		if strings.Contains(plan, "SCAN s;") || strings.HasSuffix(plan, "SCAN s") || strings.Contains(plan, "SCAN s USING INDEX sqlite_autoindex") {
			t.Errorf("%s: plan %q scans samples", tc.name, plan)
		}
	}
}
