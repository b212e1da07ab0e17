// Command sweep runs a generation job on regen's simulator at a grid of
// fixed lane concurrencies and with concurrency: auto, and prints goodput
// (completion tokens per simulated second), retractions and crashes per
// setting, so the adaptive limiter's claims can be reproduced:
//
//	go run ./bench/sweep [-workloads kv231k,kv116k,short,pair,kv58k,crash,mt1,mt2,mt4] [-samples 800] [-conversations 3200] [-speed 50] [-balance tokens,affinity]
//
// Every cell is the whole job end to end through regen's runner (ingest,
// the fleet, probes, the dispatcher, SQLite), on fresh servers and a fresh
// store. See bench/sweep/README.md for the workloads and how time is measured.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/regen-dev/regen/bench/internal/bound"
)

func main() {
	names := flag.String("workloads", "kv231k,kv116k,short,pair,crash,mt1,mt2,mt4,mtlong", "comma-separated workloads: kv231k, kv116k, short, kv58k, pair, crash, mt1, mt2, mt4, mtlong")
	balance := flag.String("balance", "tokens,affinity", "the job's balance settings to run each setting at (tokens = token-aware balancing alone, affinity = conversation and prefix affinity with conversation admission, affinity-only = affinity without admission)")
	samples := flag.Int("samples", 800, "prompts per job")
	conversations := flag.Int("conversations", 3200, "conversations per job of the multi-turn workloads (mt1, mt2, mt4)")
	longConversations := flag.Int("long-conversations", 1200, "conversations per job of the long multi-turn workload (mtlong)")
	priority := flag.Bool("priority", true, "start the multi-turn workloads' servers with priority scheduling (SGLang's --enable-priority-scheduling)")
	speed := flag.Float64("speed", 100, "simulator speed (simulated seconds per real second)")
	probe := flag.Duration("probe-every", 5*time.Second, "probe period in simulated time (the job's monitor.probe_every is this / speed)")
	grid := flag.String("grid", "", "fixed settings to run instead of each workload's grid, e.g. 32/8,150/32 (\"none\" = auto only)")
	noAuto := flag.Bool("no-auto", false, "skip the auto cell")
	repeat := flag.Int("repeat", 1, "runs per setting; the table shows the mean and the range")
	crashAbove := flag.Float64("crash-kv-above", 0, "override the crash workload's KV usage threshold")
	crashFor := flag.Duration("crash-kv-for", 0, "override how long (simulated) KV usage must stay above it")
	truncate := flag.Float64("truncate", -1, "override every workload's share of requests that run to max_tokens (simulator truncate_fraction)")
	streamInterval := flag.Int("stream-interval", 16, "simulator tokens per stream hand-over (SGLang's --stream-interval)")
	profile := flag.String("profile", "calibrated", "simulator step times for every server: calibrated or fast (regen sim --profile; -sim knobs override it)")
	simFlag := flag.String("sim", "", "simulator knobs for every server, e.g. prefill_per_ktoken=80ms,decode_base=30ms (applied last)")
	verbose := flag.Bool("v", false, "log the runner's info lines and every limit decision to stderr, and list each job's last answers (its tail)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole sweep to this file")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err == nil && pprof.StartCPUProfile(f) == nil {
			defer pprof.StopCPUProfile()
		}
	}
	if *crashAbove > 0 || *crashFor > 0 {
		crashOverride = map[string]any{}
		if *crashAbove > 0 {
			crashOverride["crash_kv_above"] = *crashAbove
		}
		if *crashFor > 0 {
			crashOverride["crash_kv_for"] = crashFor.String()
		}
	}
	truncateOverride = *truncate
	for _, kv := range strings.Split(*simFlag, ",") {
		if k, v, ok := strings.Cut(strings.TrimSpace(kv), "="); ok {
			if simOverride == nil {
				simOverride = map[string]any{}
			}
			simOverride[k] = v
		}
	}
	e := env{samples: *samples, conversationsN: *conversations, speed: *speed, probe: (time.Duration(float64(*probe) / *speed)).Round(time.Millisecond),
		verbose: *verbose, logWriter: os.Stderr, streamInterval: *streamInterval, profile: *profile, longN: *longConversations, priority: *priority}
	if err := run(e, *names, *probe, *grid, !*noAuto, max(*repeat, 1), strings.Split(*balance, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "sweep:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func run(e env, names string, probe time.Duration, grid string, withAuto bool, repeat int, balances []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	selected, err := selectWorkloads(names)
	if err != nil {
		return err
	}
	custom, err := parseGrid(grid)
	if err != nil {
		return err
	}
	if e.dir, err = os.MkdirTemp("", "regen-sweep-"); err != nil {
		return err
	}
	defer os.RemoveAll(e.dir)
	e.prompts = filepath.Join(e.dir, "prompts.jsonl")
	if err := writePrompts(e.prompts, e.samples, 1); err != nil {
		return err
	}
	e.conversations = filepath.Join(e.dir, "conversations.jsonl")
	if err := writeConversations(e.conversations, e.conversationsN, 1); err != nil {
		return err
	}
	e.long = filepath.Join(e.dir, "long.jsonl")
	if err := writeLongConversations(e.long, e.longN, 1); err != nil {
		return err
	}
	for _, w := range selected {
		if w.Supervised && e.regenBin == "" {
			e.regenBin = filepath.Join(e.dir, "regen")
			fmt.Fprintln(os.Stderr, "building regen for supervised servers...")
			cmd := exec.CommandContext(ctx, "go", "build", "-o", e.regenBin, "github.com/regen-dev/regen/cmd/regen")
			cmd.Stderr = os.Stderr
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("build regen: %w", err)
			}
		}
	}
	fmt.Printf("regen sweep %s: %d prompts of 400-1,400 words, %d conversations (mt*); lanes short max_tokens %d (prompts <= %d est. tokens) / long %d; simulator profile %s, speed %g, probes every %s simulated (%s real); %d cores (GOMAXPROCS); load average %s\n",
		time.Now().Format("2006-01-02 15:04"), e.samples, e.conversationsN, shortMaxTokens, shortMaxPrompt, longMaxTokens, e.profile, e.speed, probe, e.probe, runtime.GOMAXPROCS(0), loadAverage())
	start := time.Now()
	for _, w := range selected {
		settings := w.Grid
		if custom != nil {
			settings = custom
		}
		if withAuto {
			settings = append(append([]setting{}, settings...), setting{})
		}
		if err := runWorkload(ctx, e, w, withBalances(settings, balances), repeat); err != nil {
			return err
		}
	}
	fmt.Printf("\ntotal %.0f s, load average %s\n", time.Since(start).Seconds(), loadAverage())
	return nil
}

// selectWorkloads looks up the comma-separated names.
func selectWorkloads(names string) ([]workload, error) {
	var selected []workload
	for _, n := range strings.Split(names, ",") {
		found := false
		for _, w := range workloads() {
			if w.Name == strings.TrimSpace(n) {
				selected = append(selected, w)
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown workload %q", n)
		}
	}
	return selected, nil
}

// runWorkload runs every setting of w repeat times and prints its table.
func runWorkload(ctx context.Context, e env, w workload, settings []setting, repeat int) error {
	fmt.Printf("\n%s: %s\n", w.Name, w.About)
	if len(w.Servers[0].Sim) > 0 {
		fmt.Printf("  simulator faults: %s\n", strings.TrimSpace(strings.ReplaceAll(yamlMap(w.Servers[0].Sim, ""), "\n", ", ")))
	}
	var cells [][]result
	for i, s := range settings {
		var runs []result
		for k := range repeat {
			fmt.Fprintf(os.Stderr, "%s %s (run %d of %d)...\n", w.Name, s, k+1, repeat)
			r, err := runCell(ctx, e, w, s, i*repeat+k)
			if err != nil {
				return err
			}
			runs = append(runs, r)
			fmt.Fprintf(os.Stderr, "  goodput %.0f tok/s, %d tokens in %.0f simulated s (%.1f s wall, %.0fx), %.0f retractions, %d crashes; bound: %s\n",
				r.goodput(), r.Tokens, r.SimSeconds, r.Wall.Seconds(), r.SimSeconds/r.Wall.Seconds(), r.Retractions, r.Crashes, bound.Note(r.Load, r.Usage))
		}
		cells = append(cells, runs)
	}
	printTable(w, cells, e.speed)
	return nil
}

// loadAverage is the machine's 1, 5 and 15 minute load averages ("?" when
// unreadable): the sweep shares its cores, and a busy machine slows the
// simulator below the speed asked for.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}

// withBalances runs every setting at each balance.
func withBalances(settings []setting, balances []string) []setting {
	var out []setting
	for _, s := range settings {
		for _, b := range balances {
			s.Balance = strings.TrimSpace(b)
			out = append(out, s)
		}
	}
	return out
}

func parseGrid(s string) ([]setting, error) {
	if s == "" {
		return nil, nil
	}
	if s == "none" {
		return []setting{}, nil
	}
	var out []setting
	for _, f := range strings.Split(s, ",") {
		a, b, ok := strings.Cut(strings.TrimSpace(f), "/")
		x, err1 := strconv.Atoi(a)
		y, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil || x <= 0 || y <= 0 {
			return nil, fmt.Errorf("grid entry %q: want short/long, e.g. 150/32", f)
		}
		out = append(out, setting{Short: x, Long: y})
	}
	return out, nil
}

// cell summarises the runs of one setting.
type cell struct {
	setting            setting
	mean, low, high    float64 // goodput
	bulk               float64 // mean goodput of the first 95% of tokens
	retractions        float64 // mean
	crashes            float64 // mean
	tokens, simSeconds float64 // mean
	effSpeed           float64 // the runs' lowest simulators' speed, simulated s per real s over the span counted
	split              []endpointShare
	limits             []string
	stopped            int        // runs stopped after maxRestarts
	hit, prefill       float64    // mean prefix-cache hit rate, prompt tokens computed
	ttft50, ttft99     float64    // mean of the runs' TTFT percentiles, simulated s
	same               float64    // share of later turns answered by the endpoint of the turn before
	later              bool       // the job had later turns (same is meaningful)
	groups             float64    // mean distinct shared prefixes per endpoint
	hitFirst, hitLater float64    // mean hit rate of first turns and of later ones, from the stored usage
	median             float64    // goodput
	bound              string     // what bound the runs summarised; runner when every run was runner-bound
	runnerRuns, runs   int        // runs that were runner-bound, of all
	load               bound.Load // mean of the summarised runs
	usage              bound.Usage
}

// summarise describes a setting by its runs that were not runner-bound
// (bench/README.md): a runner-bound run measured the process, not the
// servers. When every run was, the cell is runner-bound and keeps them all.
func summarise(all []result) cell {
	var runs []result
	for _, r := range all {
		if r.Bound != bound.Runner {
			runs = append(runs, r)
		}
	}
	c := cell{runs: len(all), runnerRuns: len(all) - len(runs), bound: bound.Runner}
	if len(runs) == 0 {
		runs = all
	} else {
		c.bound = boundOf(runs)
	}
	c.setting, c.low, c.high, c.effSpeed = runs[0].Setting, runs[0].goodput(), runs[0].goodput(), 1e9
	var goodputs []float64
	n := float64(len(runs))
	for _, r := range runs {
		goodputs = append(goodputs, r.goodput())
		c.load.Busy += r.Load.Busy / n
		c.load.KV += r.Load.KV / n
		c.load.Queue += r.Load.Queue / n
		c.load.InFlight += r.Load.InFlight / n
		c.usage.CPUShare += r.Usage.CPUShare / n
		c.usage.SpeedShare += r.Usage.SpeedShare / n
		g := r.goodput()
		c.mean += g / n
		c.bulk += r.bulk() / n
		c.low, c.high = min(c.low, g), max(c.high, g)
		c.retractions += r.Retractions / n
		c.crashes += float64(r.Crashes) / n
		c.tokens += float64(r.Tokens) / n
		c.simSeconds += r.SimSeconds / n
		c.effSpeed = min(c.effSpeed, r.EffSpeed)
		c.limits = append(c.limits, r.Limits...)
		c.hit += r.hitRate() / n
		c.prefill += (r.Prompt - r.Cached) / n
		c.ttft50 += percentile(r.TTFT, 0.5) / n
		c.ttft99 += percentile(r.TTFT, 0.99) / n
		c.groups += r.Groups / n
		if r.FirstPrompt > 0 {
			c.hitFirst += r.FirstCached / r.FirstPrompt / n
		}
		if r.LaterPrompt > 0 {
			c.hitLater += r.LaterCached / r.LaterPrompt / n
		}
		if r.LaterTurns > 0 {
			c.same += float64(r.SameEndpoint) / float64(r.LaterTurns) / n
			c.later = true
		}
		if r.Stopped {
			c.stopped++
		}
	}
	c.median = median(goodputs)
	for i, p := range runs[0].PerEndpoint {
		share := p
		share.Tokens = 0
		for _, r := range runs {
			share.Tokens += r.PerEndpoint[i].Tokens / int64(len(runs))
		}
		c.split = append(c.split, share)
	}
	return c
}

func printTable(w workload, runs [][]result, speed float64) {
	var cs []cell
	for _, r := range runs {
		cs = append(cs, summarise(r))
	}
	best := bestFixed(cs)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  short/long balance\tgoodput\tmedian\trange\tvs best fixed\tbound\tsaturated / KV / queue / in flight\tcpu / speed\tfirst 95%\tcache hit\t1st / later\tprefill\tTTFT p50\tp99\tsame ep\tprefixes/ep\tretractions\tcrashes\ttokens\tsimulated s\tspeed\tsplit (tokens per endpoint)\t")
	slow, stoppedAny, runnerAny := false, false, false
	for i, c := range cs {
		rel := "-"
		if best >= 0 && c.bound != bound.Runner {
			rel = fmt.Sprintf("%.1f%%", 100*c.mean/cs[best].mean)
		}
		mark := ""
		if i == best {
			mark = " (best)"
		}
		var split []string
		for _, p := range c.split {
			split = append(split, fmt.Sprintf("%dk pool: %.2fM", p.KV/1000, float64(p.Tokens)/1e6))
		}
		same, groups, hitSplit := "-", "-", "-"
		if c.later {
			same = fmt.Sprintf("%.0f%%", 100*c.same)
			hitSplit = fmt.Sprintf("%.0f%% / %.0f%%", 100*c.hitFirst, 100*c.hitLater)
		}
		if c.groups > 0 {
			groups = fmt.Sprintf("%.0f", c.groups)
		}
		flag := ""
		if c.effSpeed < 0.9*speed {
			flag, slow = "*", true
		}
		if c.stopped > 0 {
			mark += fmt.Sprintf(" (%d of %d stopped)", c.stopped, len(runs[i]))
			stoppedAny = true
		}
		bound := c.bound
		if c.runnerRuns > 0 {
			bound += fmt.Sprintf(" (%d of %d runs runner-bound)", c.runnerRuns, c.runs)
			runnerAny = true
		}
		fmt.Fprintf(tw, "  %s%s\t%.0f\t%.0f\t%.0f-%.0f\t%s\t%s\t%.0f%% / %.2f / %.1f / %.0f\t%.0f%% / %.0f%%\t%.0f\t%.1f%%\t%s\t%.2fM\t%.2fs\t%.2fs\t%s\t%s\t%.1f\t%.1f\t%.2fM\t%.0f\t%.0fx%s\t%s\t\n", c.setting, mark, c.mean, c.median, c.low, c.high, rel,
			bound, 100*c.load.Busy, c.load.KV, c.load.Queue, c.load.InFlight, 100*c.usage.CPUShare, 100*c.usage.SpeedShare,
			c.bulk, 100*c.hit, hitSplit, c.prefill/1e6, c.ttft50, c.ttft99, same, groups, c.retractions, c.crashes, c.tokens/1e6, c.simSeconds, c.effSpeed, flag, strings.Join(split, ", "))
	}
	tw.Flush()
	printNotes(cs, best, speed, slow, stoppedAny, runnerAny)
}

// bestFixed is the index of the fixed setting with the highest goodput
// that crashed never and was not runner-bound, -1 when none.
func bestFixed(cs []cell) int {
	best := -1
	for i, c := range cs {
		if c.setting.auto() || c.crashes > 0 || c.stopped > 0 || c.bound == bound.Runner {
			continue
		}
		if best < 0 || c.mean > cs[best].mean {
			best = i
		}
	}
	return best
}

// printNotes prints the table's footnotes, the best fixed setting, the
// affinity / tokens ratios (refused for runner-bound cells) and the limits.
func printNotes(cs []cell, best int, speed float64, slow, stoppedAny, runnerAny bool) {
	if stoppedAny {
		fmt.Printf("  stopped: the server crashed again at every restart, and the run was stopped after %d restarts; goodput is what it had generated by then\n", maxRestarts)
	}
	if slow {
		fmt.Printf("  * the simulator ran below 90%% of speed %g (CPU shared): client latency counted as more simulated time in that cell\n", speed)
	}
	if runnerAny {
		fmt.Println("  runner-bound runs are left out of their cell's figures; a cell whose every run was runner-bound shows them, marked, and gives no ratio (bench/README.md)")
	}
	if best >= 0 {
		fmt.Printf("  best fixed: %s (crash-free, not runner-bound)\n", cs[best].setting)
	}
	for _, c := range cs {
		if c.setting.Balance == "tokens" || c.setting.Balance == "" {
			continue
		}
		for _, b := range cs {
			if b.setting.Balance != "tokens" || b.setting.Short != c.setting.Short || b.setting.Long != c.setting.Long || b.mean <= 0 {
				continue
			}
			name, bal := strings.TrimSuffix(c.setting.String(), " "+c.setting.Balance), c.setting.Balance
			if c.bound == bound.Runner || b.bound == bound.Runner {
				fmt.Printf("  %s: %s / tokens not reported: runner-bound (%.0f / %.0f, bound %s / %s)\n", name, bal, c.mean, b.mean, c.bound, b.bound)
				continue
			}
			fmt.Printf("  %s: %s / tokens goodput %.3f (%.0f / %.0f; median %.3f: %.0f [%.0f-%.0f] / %.0f [%.0f-%.0f]; p99 TTFT %.1f / %.1f s; bound %s / %s)\n",
				name, bal, c.mean/b.mean, c.mean, b.mean, c.median/b.median, c.median, c.low, c.high, b.median, b.low, b.high, c.ttft99, b.ttft99, c.bound, b.bound)
		}
	}
	for _, c := range cs {
		for _, l := range c.limits {
			fmt.Printf("  %s: %s\n", c.setting, l)
		}
	}
}

// boundOf is what bound most of runs (server before limit on a tie).
func boundOf(runs []result) string {
	n := map[string]int{}
	for _, r := range runs {
		n[r.Bound]++
	}
	if n[bound.Server] >= n[bound.Limit] {
		return bound.Server
	}
	return bound.Limit
}

// median is the middle of xs (the mean of the two middle ones), 0 when empty.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// percentile is the p-quantile of xs (nearest rank), 0 when empty.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(int(p*float64(len(s))), len(s)-1)]
}
