package stats

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

func nearestRank(values []int, p float64) int {
	s := slices.Clone(values)
	slices.Sort(s)
	return s[int(math.Ceil(p*float64(len(s))))-1]
}

// TestComputeMatchesBruteForce stores a few hundred answers of random
// lengths through the store's transitions and compares every percentile
// with a sort of the same numbers.
func TestComputeMatchesBruteForce(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	var in []store.NewSample
	for i := range 300 {
		p := []string{"A", "B"}[i%2]
		in = append(in, store.NewSample{ID: fmt.Sprintf("%s%03d", p, i), Partition: p, Lane: "short", Body: []byte(`{}`), Origin: fmt.Sprintf("f:%d", i)})
	}
	if _, err := st.Ingest(ctx, in); err != nil {
		t.Fatal(err)
	}
	// One duplicate id from another row.
	dup := in[0]
	dup.Origin = "f:dup"
	if _, err := st.Ingest(ctx, []store.NewSample{dup}); err != nil {
		t.Fatal(err)
	}
	prompt := map[string][]int{}
	completion := map[string][]int{}
	var allP, allC []int
	claimed, err := st.Claim(ctx, "short", 300, "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	truncated, rejected := map[string]int{}, 0
	for i, c := range claimed {
		pt, ct := 10+rng.IntN(5000), 1+rng.IntN(16000)
		r := store.Result{Response: []byte(`{}`), FinishReason: "stop", PromptTokens: pt, CompletionTokens: ct}
		switch {
		case i%10 == 0:
			r.FinishReason = "length"
			truncated[c.Partition]++
			err = st.Reject(ctx, c.ID, "w", r, "truncated", "cut")
			rejected++
		case i%7 == 0:
			r.ReasoningTokens = ct / 2
			err = st.Complete(ctx, c.ID, "w", r)
		default:
			err = st.Complete(ctx, c.ID, "w", r)
		}
		if err != nil {
			t.Fatal(err)
		}
		prompt[c.Partition] = append(prompt[c.Partition], pt)
		completion[c.Partition] = append(completion[c.Partition], ct)
		allP, allC = append(allP, pt), append(allC, ct)
	}
	rep, err := Compute(ctx, st, "j", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	check := func(name string, got Percentiles, values []int) {
		t.Helper()
		want := Percentiles{P50: nearestRank(values, 0.5), P90: nearestRank(values, 0.9), P99: nearestRank(values, 0.99), Max: slices.Max(values)}
		var sum int64
		for _, v := range values {
			sum += int64(v)
		}
		want.Sum, want.Mean = sum, int(math.Round(float64(sum)/float64(len(values))))
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s percentiles (-want +got):\n%s", name, diff)
		}
	}
	if len(rep.Cells) != 2 {
		t.Fatalf("cells = %+v, want A and B", rep.Cells)
	}
	for _, c := range rep.Cells {
		check(c.Partition+" prompt", c.PromptTokens, prompt[c.Partition])
		check(c.Partition+" completion", c.CompletionTokens, completion[c.Partition])
		if c.Answers != 150 || c.Truncated != truncated[c.Partition] || c.Samples.Total != 150 {
			t.Errorf("cell %s: %d answers, %d truncated, %d samples", c.Partition, c.Answers, c.Truncated, c.Samples.Total)
		}
	}
	check("total prompt", rep.Total.PromptTokens, allP)
	check("total completion", rep.Total.CompletionTokens, allC)
	if rep.Total.Rejected != rejected || math.Abs(rep.Total.RejectRate-float64(rejected)/300) > 1e-9 {
		t.Errorf("total rejected %d rate %v, want %d", rep.Total.Rejected, rep.Total.RejectRate, rejected)
	}
	if diff := cmp.Diff([]RuleCount{{Rule: "truncated", N: rejected}}, rep.Rejects); diff != "" {
		t.Errorf("rejects (-want +got):\n%s", diff)
	}
	if rep.Duplicates.Total != 1 || rep.Duplicates.SameContent != 1 || len(rep.Duplicates.Examples) != 1 {
		t.Errorf("duplicates = %+v, want the one duplicate row", rep.Duplicates)
	}
	// Answers stored within seconds are counted second by second.
	var answers int
	var tokens int64
	for _, p := range rep.Throughput {
		answers += p.Answers
		tokens += p.CompletionTokens
	}
	if rep.BucketSeconds != 1 || len(rep.Throughput) == 0 || len(rep.Throughput) > 30 || answers != 300 || tokens != rep.Total.CompletionTokens.Sum {
		t.Errorf("throughput = %d points of %ds, %d answers, %d tokens; want 1 s buckets holding all 300 answers and %d tokens",
			len(rep.Throughput), rep.BucketSeconds, answers, tokens, rep.Total.CompletionTokens.Sum)
	}
	if rep.Total.ReasoningShare <= 0 || rep.Total.WithReasoning == 0 {
		t.Errorf("reasoning share %v, with reasoning %d; want some", rep.Total.ReasoningShare, rep.Total.WithReasoning)
	}
}

// TestFoldBuckets: minutes fold into the axis' wider buckets, a stall
// stays as empty buckets, the rate is per second of bucket.
func TestFoldBuckets(t *testing.T) {
	t0 := time.Unix(1_000_000*60, 0)
	var mins []store.MinuteThroughput
	for _, m := range []int{0, 1, 2, 150} { // a stall between minute 2 and 150
		mins = append(mins, store.MinuteThroughput{Minute: t0.Add(time.Duration(m) * time.Minute), Requests: 1, CompletionTokens: 600})
	}
	a := AxisFor(t0, t0.Add(151*time.Minute-time.Nanosecond), time.Minute)
	pts := fold(mins, a, t0.Add(24*time.Hour))
	if a.Bucket != 5*time.Minute || len(pts) != 31 {
		t.Fatalf("fold: %d points of %s, want 31 of 5m", len(pts), a.Bucket)
	}
	// The axis ends at minute 151: its buckets start at minute 151-155 = -4.
	if pts[0].Answers != 1 || pts[1].Answers != 2 || pts[1].CompletionPerSec != 1200.0/300 || pts[2].Answers != 0 || pts[30].Answers != 1 {
		t.Errorf("points = %+v ... %+v", pts[:3], pts[30])
	}
}
