package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/regen-dev/regen/internal/review"
)

const reviewJob = `name: rv
model: sim-model
# A third of the answers run to max_tokens: a cut tool call is rejected
# (tool_args), a whole one ends the conversation (the simulator never makes
# the dataset's call).
server: {engine: sim, sim: {profile: fast, speed: 200, truncate_fraction: 0.3}}
sources:
  - {partition: R, path: chats.jsonl, conversations: conversations, tools: tools, id: id}
lanes:
  - {name: default, concurrency: 16, max_tokens: 1024}
quality: {truncated: false}
output: {formats: [sharegpt]}
`

// html is markup in the dataset's text: the page must show it as text.
const html = `<img src=x onerror="window.pwned=1"><script>window.pwned=2</script> & <b>bold</b>`

// writeReviewChats writes three-exchange chats (every turn regenerated)
// and tool-call chats, whose recorded call the simulator never makes, so
// they end early after their first turn.
func writeReviewChats(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	enc := json.NewEncoder(f)
	for i := range 10 {
		var conv []map[string]string
		for k := range 3 {
			conv = append(conv,
				map[string]string{"from": "human", "value": fmt.Sprintf("plain-%02d question %d %s", i, k+1, html)},
				map[string]string{"from": "gpt", "value": fmt.Sprintf("Original answer %d of plain-%02d", k+1, i)})
		}
		must(t, enc.Encode(map[string]any{"id": fmt.Sprintf("plain-%02d", i), "conversations": conv}))
		tools := []map[string]any{{"type": "function", "function": map[string]any{"name": "get_weather", "parameters": map[string]any{"type": "object"}}}}
		must(t, enc.Encode(map[string]any{"id": fmt.Sprintf("tool-%02d", i), "tools": tools, "conversations": []map[string]string{
			{"from": "human", "value": fmt.Sprintf("What is the weather in Paris? (asked by tool-%02d)", i)},
			{"from": "function_call", "value": `{"name": "get_weather", "arguments": {"city": "Paris"}}`},
			{"from": "observation", "value": `{"temp_c": 21}`},
			{"from": "gpt", "value": "It is 21 degrees in Paris."},
		}}))
	}
	must(t, f.Close())
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestE2EReviewPage drives headless Chromium over the sample page of a
// finished multi-turn job (served by regen watch --web, no runner): a
// three-turn conversation shows each turn's input, the dataset's answer
// beside the regenerated one with its lane, finish reason and usage; a
// conversation that ended early says why, with the turns it never reached
// marked so; the dataset's markup is shown as text, never run; and
// `regen show` prints the same turns.
func TestE2EReviewPage(t *testing.T) {
	t.Parallel()
	bctx := startBrowser(t)
	dir := t.TempDir()
	writeReviewChats(t, filepath.Join(dir, "chats.jsonl"))
	must(t, os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(reviewJob), 0o644))
	if res := regen(t, dir, "run", "job.yaml"); res.code != 0 {
		t.Fatalf("run: %s", res)
	}
	watch := startRegen(t, dir, "watch", "job.yaml", "--web", "127.0.0.1:0", "--every", "1h")
	defer func() {
		_ = watch.cmd.Process.Signal(os.Interrupt)
		watch.wait(t)
	}()
	var base string
	for deadline := time.Now().Add(30 * time.Second); base == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if m := dashboardURL.FindStringSubmatch(watch.stderr.String()); m != nil {
			base = m[1]
		}
	}
	if base == "" {
		t.Fatalf("watch --web printed no address:\n%s", watch.stderr.String())
	}

	tab, closeTab := chromedp.NewContext(bctx)
	defer closeTab()
	if _, err := chromedp.Run(tab, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	p := page{t: t, ctx: tab}

	// What the page must show, from the API's review document.
	sampleReview := func(id string) review.Sample {
		var doc struct {
			Review *review.Sample `json:"review"`
		}
		httpGet(t, base+"/api/samples/"+id, &doc)
		if doc.Review == nil {
			t.Fatalf("%s has no review", id)
		}
		return *doc.Review
	}
	type turnView struct {
		Title, Input, Original, Regenerated, Meta string
	}
	open := func(id string) []turnView {
		run(p, "open "+id, chromedp.Navigate(base+"/#samples/"+id))
		run(p, "sample "+id+" shown", chromedp.Poll[bool](fmt.Sprintf(`document.body.dataset.sampleShown === %q`, id)))
		return run(p, "turns of "+id, chromedp.Evaluate[[]turnView](`[...document.querySelectorAll("#sample-turns .turn")].map((t) => ({
			Title: t.querySelector("h3").textContent, Input: t.querySelector(".input").textContent,
			Original: t.querySelector(".side.original").textContent, Regenerated: t.querySelector(".side.regenerated").textContent,
			Meta: (t.querySelector(".answer-meta") || {textContent: ""}).textContent}))`))
	}

	// A conversation regenerated turn by turn.
	const plain = "R/plain-03"
	rv := sampleReview(plain)
	turns := open(plain)
	if len(turns) != 3 || len(rv.Turns) != 3 {
		t.Fatalf("%s: %d turn boxes, review has %d turns; want 3", plain, len(turns), len(rv.Turns))
	}
	for k, tv := range turns {
		a := rv.Turns[k].Answer
		if a == nil {
			t.Fatalf("%s turn %d: no answer in the review", plain, k)
		}
		checks := []struct {
			what, in, want string
		}{
			{"title", tv.Title, fmt.Sprintf("Turn %d of 3", k+1)},
			{"input", tv.Input, fmt.Sprintf("plain-03 question %d %s", k+1, html)},
			{"original", tv.Original, fmt.Sprintf("Original answer %d of plain-03", k+1)},
			{"regenerated", tv.Regenerated, a.Content},
			{"lane and finish", tv.Meta, fmt.Sprintf("lane default · attempts %d · finish %s · %d prompt + %d completion tokens", a.Attempts, a.FinishReason, a.Usage.PromptTokens, a.Usage.CompletionTokens)},
		}
		for _, c := range checks {
			if !strings.Contains(c.in, c.want) {
				t.Errorf("%s turn %d %s: %q lacks %q", plain, k, c.what, c.in, c.want)
			}
		}
		if strings.Contains(tv.Regenerated, "Original answer") {
			t.Errorf("%s turn %d: the dataset's answer shown as the regenerated one", plain, k)
		}
	}
	if fate := run(p, "fate hidden", chromedp.Evaluate[bool](`document.getElementById("sample-fate").hidden`)); !fate {
		t.Errorf("%s: a conversation done in full shows a fate banner: %q", plain, p.text("sample-fate"))
	}
	// The markup stayed text: nothing ran, no element was made from it.
	escaped := run(p, "escaping", chromedp.Evaluate[[]any](`[window.pwned === undefined, document.querySelectorAll("#sample img, #sample script, #sample b").length]`))
	if escaped[0] != true || escaped[1] != float64(0) {
		t.Errorf("the dataset's markup ran or became elements: pwned undefined %v, elements %v", escaped[0], escaped[1])
	}
	must(t, os.MkdirAll(screenshotDir(), 0o755))
	shot := func(name string) {
		png := run(p, "screenshot", chromedp.FullScreenshot(100))
		path := filepath.Join(screenshotDir(), name+".png")
		must(t, os.WriteFile(path, png, 0o644))
		t.Logf("screenshot %s (%d bytes)", path, len(png))
	}
	shot("review-multiturn")

	// A conversation that ended early after its first answer, and one a
	// quality rule rejected.
	var ended, rejected struct {
		Rows []struct{ ID string } `json:"rows"`
	}
	httpGet(t, base+"/api/samples?ended=true&limit=100", &ended)
	httpGet(t, base+"/api/samples?state=rejected&limit=100", &rejected)
	if len(ended.Rows) == 0 || len(rejected.Rows) == 0 {
		t.Fatalf("%d conversations ended early and %d rejected; want some of each", len(ended.Rows), len(rejected.Rows))
	}
	tool := ended.Rows[0].ID
	rv = sampleReview(tool)
	turns = open(tool)
	if rv.EndedEarly == "" || len(turns) != 2 {
		t.Fatalf("%s: ended early %q, %d turn boxes; want a reason and 2 boxes", tool, rv.EndedEarly, len(turns))
	}
	if fate := p.text("sample-fate"); fate != "Ended early: "+rv.EndedEarly {
		t.Errorf("%s fate = %q, want %q", tool, fate, "Ended early: "+rv.EndedEarly)
	}
	// One turn convention (issue 30 item 7): the banner's reason names the
	// answered turn as the boxes below it do, counting from 1.
	heads := run(p, "turn headings", chromedp.Evaluate[[]string](`[...document.querySelectorAll("#sample-turns h3")].map((h) => h.textContent)`))
	if !strings.HasPrefix(rv.EndedEarly, "turn 1 ") || len(heads) != 2 || heads[0] != "Turn 1 of 2" || heads[1] != "Turn 2 of 2" {
		t.Errorf("%s: ended early %q above turns %q; want the reason to name turn 1, as the first box", tool, rv.EndedEarly, heads)
	}
	if !strings.Contains(turns[0].Original, "get_weather") || !strings.Contains(turns[0].Original, "Paris") ||
		!strings.Contains(turns[1].Original, "It is 21 degrees in Paris.") || !strings.Contains(turns[1].Input, `{"temp_c": 21}`) ||
		!strings.Contains(turns[1].Regenerated, "(not reached)") || strings.Contains(turns[0].Regenerated, "(not reached)") {
		t.Errorf("%s turns = %+v", tool, turns)
	}
	shot("review-ended-early")
	cut := rejected.Rows[0].ID
	rv = sampleReview(cut)
	turns = open(cut)
	if want := fmt.Sprintf("Rejected by rule %s: %s", rv.Rule, rv.Evidence); rv.Rule == "" || p.text("sample-fate") != want {
		t.Errorf("%s fate = %q, want %q", cut, p.text("sample-fate"), want)
	}
	last := turns[len(rv.Turns)-1]
	for _, t2 := range turns {
		if strings.Contains(t2.Regenerated, "Regenerated (rejected)") {
			last = t2
		}
	}
	if !strings.Contains(last.Regenerated, "Regenerated (rejected)") {
		t.Errorf("%s: no turn marks its answer rejected: %+v", cut, turns)
	}
	shot("review-rejected")

	// The filters: ended early lists the tool chats only.
	run(p, "filter ended early", chromedp.Evaluate[chromedp.Void](`document.getElementById("samples-ended").click()`))
	ids := run(p, "ended-early rows", chromedp.Poll[[]string](`(() => { const ids = [...document.querySelectorAll("#samples tbody tr td:first-child")].map((td) => td.textContent);
		return ids.length && ids.every((id) => id.startsWith("R/tool-")) ? ids : null; })()`, chromedp.WithPollingTimeout(10*time.Second)))
	if len(ids) != len(ended.Rows) {
		t.Errorf("ended-early filter lists %v, want the %d the API lists", ids, len(ended.Rows))
	}

	// regen show prints the same turns.
	res := regen(t, dir, "show", "job.yaml", tool)
	for _, want := range []string{"ended early: " + rv.EndedEarly, "── turn 1 of 2 ──", "original (dataset):", "tool call: get_weather",
		"── turn 2 of 2 ──", "  [assistant] It is 21 degrees in Paris.", "regenerated: (not reached)"} {
		if res.code != 0 || !strings.Contains(res.stdout, want) {
			t.Errorf("regen show %s lacks %q:\n%s", tool, want, res)
		}
	}
	if res := regen(t, dir, "show", "job.yaml", "plain-03"); res.code != 1 || !strings.Contains(res.stderr, `no sample with id "plain-03"`) {
		t.Errorf("show of an id without its partition: %s", res)
	}
}

// screenshotDir is $REGEN_SCREENSHOTS, or a folder under the system's temp dir.
func screenshotDir() string {
	if d := os.Getenv("REGEN_SCREENSHOTS"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "regen-screenshots")
}
