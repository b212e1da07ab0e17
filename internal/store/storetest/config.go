package storetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/store"
)

// Configuration generations: the fingerprint check, --new-config's
// requeue, the generation of every stored answer.

var configTests = []struct {
	name string
	fn   func(t *testing.T, s store.Store)
}{
	{"ConfigureAdoptsAndChecks", testConfigureAdopts},
	{"ConfigureRefusesAChange", testConfigureRefuses},
	{"NewGenerationRequeuesEverything", testNewGeneration},
	{"ServedModelRecordedOnce", testServedModel},
	{"AnswersKeepTheirGeneration", testAnswerGeneration},
	{"NewGenerationRebuildsBodies", testRebuild},
	{"LegacyFingerprintReplaced", testLegacyFingerprint},
	{"ForgetIngestErrorsOfOneFile", testForgetIngestErrors},
	{"MetaFirstWriterWins", testMeta},
	{"RelocateNamesFilesRelative", testRelocate},
}

var (
	cfgA = store.Config{Fingerprint: "aaaa", Canonical: []byte(`{"generation":{"temperature":0.7},"model":"sim-model"}`)}
	cfgB = store.Config{Fingerprint: "bbbb", Canonical: []byte(`{"generation":{"temperature":1.3},"model":"other-model"}`)}
)

var at = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func configure(t *testing.T, s store.Store, c store.Config, o store.ConfigureOptions) store.Generation {
	t.Helper()
	g, err := s.Configure(context.Background(), c, o)
	if err != nil {
		t.Fatalf("Configure(%s): %v", c.Fingerprint, err)
	}
	return g
}

func generations(t *testing.T, s store.Store) []store.Generation {
	t.Helper()
	gs, err := s.Generations(context.Background())
	if err != nil {
		t.Fatalf("Generations: %v", err)
	}
	return gs
}

func testConfigureAdopts(t *testing.T, s store.Store) {
	if gs := generations(t, s); len(gs) != 0 {
		t.Fatalf("Generations before Configure = %v, want none", gs)
	}
	want := store.Generation{N: 1, Fingerprint: cfgA.Fingerprint, Config: cfgA.Canonical, Started: at}
	if got := configure(t, s, cfgA, store.ConfigureOptions{Now: at}); !cmp.Equal(want, got) {
		t.Errorf("first Configure (-want +got):\n%s", cmp.Diff(want, got))
	}
	// The same configuration again, asked to start a new generation or
	// not: the same generation, nothing requeued.
	for _, newGen := range []bool{false, true} {
		got := configure(t, s, cfgA, store.ConfigureOptions{NewGeneration: newGen, Now: at.Add(time.Hour)})
		if !cmp.Equal(want, got) {
			t.Errorf("Configure again (new generation %v) (-want +got):\n%s", newGen, cmp.Diff(want, got))
		}
	}
	if diff := cmp.Diff([]store.Generation{want}, generations(t, s)); diff != "" {
		t.Errorf("Generations (-want +got):\n%s", diff)
	}
}

func testConfigureRefuses(t *testing.T, s store.Store) {
	ctx := context.Background()
	first := configure(t, s, cfgA, store.ConfigureOptions{Now: at})
	ingest(t, s, samples("p", "short", "a", "b"))
	c := claimOne(t, s, "short", "w1", "a")
	r := result("a")
	r.Generation = first.N
	must(t, s.Complete(ctx, c.ID, "w1", r))

	_, err := s.Configure(ctx, cfgB, store.ConfigureOptions{})
	var changed *store.ConfigChangedError
	if !errors.As(err, &changed) || !errors.Is(err, store.ErrConfigChanged) {
		t.Fatalf("Configure with another fingerprint: %v, want a ConfigChangedError", err)
	}
	if diff := cmp.Diff(first, changed.Current); diff != "" {
		t.Errorf("ConfigChangedError.Current (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(cfgB, changed.Want); diff != "" {
		t.Errorf("ConfigChangedError.Want (-want +got):\n%s", diff)
	}
	// Refused: nothing moved.
	wantStates(t, s, map[string]int{"p/short/done": 1, "p/short/pending": 1})
	first.Answers = 1
	if diff := cmp.Diff([]store.Generation{first}, generations(t, s)); diff != "" {
		t.Errorf("Generations after a refusal (-want +got):\n%s", diff)
	}
}

// newGenFixture puts one sample in every state a new generation must
// requeue: done, rejected, dead, in progress at its second turn, leased,
// pending after a retry; and one pending untouched.
func newGenFixture(t *testing.T, s store.Store, gen int) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "done", "rej", "dead", "multi", "leased", "retried", "fresh"))
	with := func(r store.Result) store.Result { r.Generation = gen; return r }
	must(t, s.Complete(ctx, claimOne(t, s, "short", "w", "done").ID, "w", with(result("done"))))
	must(t, s.Reject(ctx, claimOne(t, s, "short", "w", "rej").ID, "w", with(result("rej")), "empty", "no content"))
	must(t, s.DeadLetter(ctx, claimOne(t, s, "short", "w", "dead").ID, "w", "HTTP 400: max_tokens too large"))
	must(t, s.CompleteTurn(ctx, claimOne(t, s, "short", "w", "multi").ID, "w", with(turnResult("multi", 0, "stop", 10, 20, 0)), "long"))
	claimOne(t, s, "short", "w", "leased")
	must(t, s.Retry(ctx, claimOne(t, s, "short", "w", "retried").ID, "w", at.Add(time.Hour), "HTTP 500"))
}

func testNewGeneration(t *testing.T, s store.Store) {
	ctx := context.Background()
	configure(t, s, cfgA, store.ConfigureOptions{Now: at})
	newGenFixture(t, s, 1)
	wantStates(t, s, map[string]int{"p/short/done": 1, "p/short/rejected": 1, "p/short/dead": 1, "p/long/pending": 1,
		"p/short/leased": 1, "p/short/pending": 2})

	// Every sample goes back to turn 0 with nothing spent, in the lane the
	// new configuration gives it: "short" is gone, every prompt up to 15
	// tokens goes to "small", longer ones to "big".
	lanes := []store.LaneRange{{Partition: "p", MinTokens: 0, MaxTokens: 15, Lane: "small"}, {Partition: "p", MinTokens: 16, Lane: "big"}}
	g := configure(t, s, cfgB, store.ConfigureOptions{NewGeneration: true, Lanes: lanes, Now: at.Add(time.Hour)})
	// done, rejected, dead, multi, leased, retried; fresh was untouched.
	want := store.Generation{N: 2, Fingerprint: cfgB.Fingerprint, Config: cfgB.Canonical, Started: at.Add(time.Hour), Requeued: 6}
	if diff := cmp.Diff(want, g); diff != "" {
		t.Errorf("new generation (-want +got):\n%s", diff)
	}
	wantGens := []store.Generation{
		// Answers of done, rej and multi's first turn moved to the history.
		{N: 1, Fingerprint: cfgA.Fingerprint, Config: cfgA.Canonical, Started: at, Superseded: 3},
		want,
	}
	if diff := cmp.Diff(wantGens, generations(t, s)); diff != "" {
		t.Errorf("Generations (-want +got):\n%s", diff)
	}
	// sample() gives len(id)+10 prompt tokens: "leased" and "retried" have
	// more than 15.
	wantStates(t, s, map[string]int{"p/small/pending": 5, "p/big/pending": 2})
	if rows := finished(t, s); len(rows) != 0 {
		t.Errorf("Finished after a new generation: %d rows, want none", len(rows))
	}
	cells, err := s.StatCells(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cells {
		if c.Requests != 0 || c.Rejected != 0 || c.CompletionTokens != 0 {
			t.Errorf("StatCells after a new generation: %+v, want nothing counted", c)
		}
	}
	// The old holder's lease is gone.
	wantNotLeased(t, "Complete by the old holder", s.Complete(ctx, "leased", "w", result("leased")))

	// Generation 2 answers every sample once, at its first turn, with
	// its attempts from zero.
	var claimed []store.Claimed
	for _, lane := range []string{"small", "big"} {
		claimed = append(claimed, claim(t, s, lane, 10, "w2")...)
	}
	if len(claimed) != 7 {
		t.Fatalf("claimed %d samples in generation 2, want 7", len(claimed))
	}
	for _, c := range claimed {
		if c.Turn != 0 || c.Attempts != 0 || len(c.Prior) != 0 {
			t.Errorf("claimed %s at turn %d with %d attempts and %d earlier turns, want turn 0, none", c.ID, c.Turn, c.Attempts, len(c.Prior))
		}
		r := result(c.ID)
		r.Generation = 2
		must(t, s.Complete(ctx, c.ID, "w2", r))
	}
	rows := finished(t, s)
	if len(rows) != 7 {
		t.Fatalf("Finished: %d rows, want 7", len(rows))
	}
	for _, r := range rows {
		if r.State != store.Done || r.Result.Generation != 2 || r.Attempts != 1 || len(r.Prior) != 0 {
			t.Errorf("row %s: state %s, generation %d, attempts %d, %d earlier turns; want done, 2, 1, none",
				r.ID, r.State, r.Result.Generation, r.Attempts, len(r.Prior))
		}
	}
	if cur, _ := store.Current(generations(t, s)); cur.Answers != 7 {
		t.Errorf("current generation's answers = %d, want 7", cur.Answers)
	}
}

func testServedModel(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, err := s.SetServedModel(ctx, 1, "m"); err == nil {
		t.Errorf("SetServedModel before any generation: no error")
	}
	configure(t, s, cfgA, store.ConfigureOptions{Now: at})
	for _, tc := range []struct{ set, want string }{{"sim-model", "sim-model"}, {"other-model", "sim-model"}} {
		got, err := s.SetServedModel(ctx, 1, tc.set)
		if err != nil || got != tc.want {
			t.Errorf("SetServedModel(%s) = %q, %v; want %q", tc.set, got, err, tc.want)
		}
	}
	if gs := generations(t, s); len(gs) != 1 || gs[0].ServedModel != "sim-model" {
		t.Errorf("Generations = %+v, want one with served model sim-model", gs)
	}
}

// Every stored answer keeps its generation: the last one and earlier turns.
func testAnswerGeneration(t *testing.T, s store.Store) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "x"))
	c := claimOne(t, s, "short", "w", "x")
	r0 := turnResult("x", 0, "stop", 10, 20, 0)
	r0.Generation = 3
	must(t, s.CompleteTurn(ctx, c.ID, "w", r0, ""))
	c = claimOne(t, s, "short", "w", "x")
	if len(c.Prior) != 1 || c.Prior[0].Generation != 3 {
		t.Fatalf("claimed earlier turns %+v, want one of generation 3", c.Prior)
	}
	r1 := turnResult("x", 1, "stop", 10, 20, 0)
	r1.Generation = 4
	must(t, s.Complete(ctx, c.ID, "w", r1))
	row, ok, err := s.Sample(ctx, "x")
	if err != nil || !ok {
		t.Fatalf("Sample: %v %v", ok, err)
	}
	fin := finished(t, s)
	// The dashboard's listing filters on it too.
	listed, err := s.Samples(ctx, store.SampleQuery{State: store.Done})
	if err != nil || len(listed) != 1 {
		t.Fatalf("Samples: %+v %v", listed, err)
	}
	got := []int{row.Prior[0].Generation, row.Result.Generation, fin[0].Prior[0].Generation, fin[0].Result.Generation, listed[0].Result.Generation}
	if diff := cmp.Diff([]int{3, 4, 3, 4, 4}, got); diff != "" {
		t.Errorf("generations of the stored answers via Sample, Finished and Samples (-want +got):\n%s", diff)
	}
}

// A new generation that rebuilds partition p holds its samples back from
// claims and forgets its files, bad rows and duplicates; ingest gives a
// held sample its new body and frees it; DropStale removes the ones no row
// gave again. Partition q is untouched.
func testRebuild(t *testing.T, s store.Store) {
	ctx := context.Background()
	configure(t, s, cfgA, store.ConfigureOptions{Now: at})
	ingest(t, s, append(samples("p", "short", "p/keep", "p/gone"), sample("q", "short", "q/other")))
	must(t, s.Complete(ctx, claimOne(t, s, "short", "w", "p/keep").ID, "w", result("p/keep")))
	must(t, s.AddIngestErrors(ctx, []store.IngestError{{Partition: "p", Origin: "p.jsonl:9", Reason: "bad"},
		{Partition: "q", Origin: "q.jsonl:9", Reason: "bad"}}))
	must(t, s.PutSourceFile(ctx, store.SourceFile{Partition: "p", Path: "p.jsonl", Fingerprint: "f", Complete: true}))
	must(t, s.PutSourceFile(ctx, store.SourceFile{Partition: "q", Path: "q.jsonl", Fingerprint: "f", Complete: true}))

	configure(t, s, cfgB, store.ConfigureOptions{NewGeneration: true, Rebuild: []string{"p"}, Now: at.Add(time.Hour)})
	if got := claim(t, s, "short", 10, "w2"); !slices.Equal(ids(got), []string{"q/other"}) {
		t.Errorf("claimed %v while p is rebuilt, want only q/other", ids(got))
	}
	if _, ok, err := s.SourceFile(ctx, "p", "p.jsonl"); err != nil || ok {
		t.Errorf("manifest entry of a rebuilt partition: ok=%v err=%v, want gone", ok, err)
	}
	if _, ok, err := s.SourceFile(ctx, "q", "q.jsonl"); err != nil || !ok {
		t.Errorf("manifest entry of q: ok=%v err=%v, want kept", ok, err)
	}
	if errs, err := s.IngestErrors(ctx, 0); err != nil || len(errs) != 1 || errs[0].Partition != "q" {
		t.Errorf("bad rows after rebuilding p = %v, %v; want q's only", errs, err)
	}

	rebuilt := sample("p", "long", "p/keep")
	rebuilt.Body = []byte(`{"messages":[{"role":"system","content":"new"},{"role":"user","content":"p/keep"}]}`)
	rebuilt.PromptTokens = 40
	n, err := s.Ingest(ctx, []store.NewSample{rebuilt, sample("p", "short", "p/new")})
	if err != nil || n != 1 {
		t.Fatalf("Ingest of a rebuilt and a new sample = %d, %v; want 1 new", n, err)
	}
	c := claimOne(t, s, "long", "w2", "p/keep")
	if string(c.Body) != string(rebuilt.Body) || c.PromptTokens != 40 {
		t.Errorf("rebuilt sample claimed with body %s, %d prompt tokens; want %s, 40", c.Body, c.PromptTokens, rebuilt.Body)
	}
	dropped, err := s.DropStale(ctx, "p")
	if err != nil || dropped != 1 {
		t.Errorf("DropStale(p) = %d, %v; want p/gone dropped", dropped, err)
	}
	if again, err := s.DropStale(ctx, "p"); err != nil || again != 0 {
		t.Errorf("DropStale(p) again = %d, %v; want 0", again, err)
	}
	wantStates(t, s, map[string]int{"p/long/leased": 1, "p/short/pending": 1, "q/short/leased": 1})
	if _, ok, err := s.Sample(ctx, "p/gone"); err != nil || ok {
		t.Errorf("Sample(p/gone) after DropStale: ok=%v err=%v, want gone", ok, err)
	}
}

// A current generation whose fingerprint is the configuration's legacy
// form takes the new fingerprint and stays the same generation.
func testLegacyFingerprint(t *testing.T, s store.Store) {
	configure(t, s, cfgA, store.ConfigureOptions{Now: at})
	g := configure(t, s, cfgB, store.ConfigureOptions{Legacy: cfgA.Fingerprint, Now: at.Add(time.Hour)})
	want := store.Generation{N: 1, Fingerprint: cfgB.Fingerprint, Config: cfgB.Canonical, Started: at}
	if diff := cmp.Diff(want, g); diff != "" {
		t.Errorf("Configure with the legacy fingerprint (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]store.Generation{want}, generations(t, s)); diff != "" {
		t.Errorf("Generations (-want +got):\n%s", diff)
	}
}

// ForgetIngestErrors drops one file's bad rows, not those of a file whose
// name it prefixes.
func testForgetIngestErrors(t *testing.T, s store.Store) {
	ctx := context.Background()
	must(t, s.AddIngestErrors(ctx, []store.IngestError{
		{Partition: "p", Origin: "data/a.jsonl:3", Reason: "cut"}, {Partition: "p", Origin: "data/a.jsonl:12", Reason: "cut"},
		{Partition: "p", Origin: "data/a.jsonl.gz:3", Reason: "bad"}, {Partition: "p", Origin: "data/b.jsonl:1", Reason: "bad"},
	}))
	must(t, s.ForgetIngestErrors(ctx, "data/a.jsonl"))
	errs, err := s.IngestErrors(ctx, 0)
	var got []string
	for _, e := range errs {
		got = append(got, e.Origin)
	}
	if want := []string{"data/a.jsonl.gz:3", "data/b.jsonl:1"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("bad rows after forgetting data/a.jsonl = %v, %v; want %v", got, err, want)
	}
}

func testMeta(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, ok, err := s.Meta(ctx, "owner"); err != nil || ok {
		t.Fatalf("Meta on a new store: ok=%v err=%v, want none", ok, err)
	}
	if got, err := s.SetMeta(ctx, "owner", "a.yaml", false); err != nil || got != "a.yaml" {
		t.Errorf("first SetMeta = %q, %v; want a.yaml", got, err)
	}
	if got, err := s.SetMeta(ctx, "owner", "b.yaml", false); err != nil || got != "a.yaml" {
		t.Errorf("second SetMeta without replace = %q, %v; want a.yaml kept", got, err)
	}
	if got, err := s.SetMeta(ctx, "owner", "c.yaml", true); err != nil || got != "c.yaml" {
		t.Errorf("SetMeta with replace = %q, %v; want c.yaml", got, err)
	}
	if v, ok, err := s.Meta(ctx, "owner"); err != nil || !ok || v != "c.yaml" {
		t.Errorf("Meta = %q, %v, %v; want c.yaml", v, ok, err)
	}
}

// Names an earlier regen stored absolute under a folder become relative
// to it in origins, the manifest, bad rows and duplicates; names outside
// it stay as they are.
func testRelocate(t *testing.T, s store.Store) {
	ctx := context.Background()
	smp := sample("p", "short", "p/a")
	smp.Origin = "/old/job/data/a.jsonl:1"
	dup := smp
	dup.Origin = "/old/job/data/a.jsonl:2"
	out := sample("p", "short", "p/b")
	out.Origin = "/shared/b.jsonl:1"
	if _, err := s.Ingest(ctx, []store.NewSample{smp, out}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Ingest(ctx, []store.NewSample{dup}); err != nil {
		t.Fatal(err)
	}
	must(t, s.AddIngestErrors(ctx, []store.IngestError{{Partition: "p", Origin: "/old/job/data/a.jsonl:3", Reason: "bad"}}))
	must(t, s.PutSourceFile(ctx, store.SourceFile{Partition: "p", Path: "/old/job/data/a.jsonl", Fingerprint: "f", Complete: true}))
	files, err := s.OriginFiles(ctx)
	if want := []string{"/old/job/data/a.jsonl", "/shared/b.jsonl"}; err != nil || !slices.Equal(files, want) {
		t.Errorf("OriginFiles = %v, %v; want %v", files, err, want)
	}
	n, err := s.Relocate(ctx, "/old/job")
	// origins 1, manifest 1, bad row 1, duplicate origin and first origin 2
	if err != nil || n != 5 {
		t.Errorf("Relocate = %d, %v; want 5 names changed", n, err)
	}
	files, err = s.OriginFiles(ctx)
	if want := []string{"/shared/b.jsonl", "data/a.jsonl"}; err != nil || !slices.Equal(files, want) {
		t.Errorf("OriginFiles after Relocate = %v, %v; want %v", files, err, want)
	}
	if row, ok, err := s.Sample(ctx, "p/a"); err != nil || !ok || row.Origin != "data/a.jsonl:1" {
		t.Errorf("Sample(p/a).Origin = %q (ok %v, %v), want data/a.jsonl:1", row.Origin, ok, err)
	}
	if _, ok, err := s.SourceFile(ctx, "p", "data/a.jsonl"); err != nil || !ok {
		t.Errorf("manifest entry by its relative name: ok=%v err=%v", ok, err)
	}
	if errs, err := s.IngestErrors(ctx, 0); err != nil || len(errs) != 1 || errs[0].Origin != "data/a.jsonl:3" {
		t.Errorf("bad rows after Relocate = %v, %v; want data/a.jsonl:3", errs, err)
	}
	d, err := s.IngestDuplicates(ctx, 10)
	if err != nil || len(d.Examples) != 1 || d.Examples[0].Origin != "data/a.jsonl:2" || d.Examples[0].FirstOrigin != "data/a.jsonl:1" {
		t.Errorf("duplicates after Relocate = %+v, %v; want data/a.jsonl:2 first at data/a.jsonl:1", d, err)
	}
	// The same file read again under its relative name is the same row.
	again := smp
	again.Origin = "data/a.jsonl:1"
	if n, err := s.Ingest(ctx, []store.NewSample{again}); err != nil || n != 0 {
		t.Errorf("Ingest of the same row by its relative name = %d, %v; want 0", n, err)
	}
	if d, err := s.IngestDuplicates(ctx, 0); err != nil || d.Total != 1 {
		t.Errorf("duplicates after reading the row again = %d, %v; want still 1", d.Total, err)
	}
}
