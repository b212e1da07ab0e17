// Command bench measures regen's hot paths against references that do the
// irreducible part of the same work in the same run, and prints the ratios.
//
//	go run ./bench [-quick] [-only llm,store,ingest,sim,e2e]
//
// Absolute figures drift with whatever else the shared machine is doing;
// the ratio against a reference measured minutes apart on the same cores is
// what to compare between runs. See bench/README.md for how to read it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/regen-dev/regen/bench/internal/bound"
)

// row is one line of the report: a regen figure and its reference.
type row struct {
	name   string
	unit   string
	better string // "lower" or "higher": which way a ratio is good
	regen  float64
	ref    float64
	note   string // what the reference is
	// sides is what bound regen's side and the reference's; nil when the
	// case measures regen's own code with no server to bind it
	// (bench/README.md, "Server- or runner-bound").
	sides *[2]bound.Cell
}

// ownCode is the bound column of a row that measures regen's own code.
const ownCode = "own code"

// outcome is what one case returns: its rows and free-form detail lines.
type outcome struct {
	rows   []row
	detail []string
}

// opts are the knobs every case reads.
type opts struct {
	quick   bool
	dir     string // scratch directory, removed at exit
	bigRows int    // bigjob: rows of the job (0 = 10^6, 2x10^5 with -quick)
	// tokenIDs: the e2e dispatcher asks for token ids (output.token_ids)
	// and stores them with every answer.
	tokenIDs bool
	// streamRounds: rounds of the streams case (0 = 1).
	streamRounds int
}

type benchCase struct {
	name string
	run  func(ctx context.Context, o opts) (outcome, error)
}

var cases = []benchCase{
	{"llm", benchLLM},
	{"store", benchStore},
	{"ingest", benchIngest},
	{"sim", benchSim},
	{"e2e", benchE2E},
	{"scale", benchScale},
	{"bigjob", benchBigJob},
	{"capture", benchCapture},
	// ceiling runs only when asked (-only ceiling): 60 worker processes
	// over about a minute.
	{"ceiling", benchCeiling},
	// streams runs only when asked (-only streams): 10,000 streams of
	// half a minute, two sides, about two minutes a round.
	{"streams", benchStreams},
}

func main() {
	quick := flag.Bool("quick", false, "smaller workloads (about 20 s instead of about 90 s)")
	only := flag.String("only", "", "comma-separated cases to run: llm, store, ingest, sim, e2e, scale, bigjob, capture, ceiling, streams (default all but ceiling and streams)")
	bigRows := flag.Int("bigjob-rows", 0, "rows of the bigjob case (default 1000000, 200000 with -quick); 10000000 for the 10^7 memory figure")
	tokenIDs := flag.Bool("token-ids", false, "e2e: ask the simulator for token ids and store them with every answer (output.token_ids)")
	worker := flag.String("ceiling-worker", "", "internal: run as one worker process of the ceiling case")
	streamRounds := flag.Int("streams-rounds", 1, "rounds of the streams case (medians over them)")
	streamsSideArg := flag.String("streams-side", "", "internal: run as one side of the streams case")
	streamsServe := flag.Bool("streams-server", false, "internal: run as the stand-in server of the streams case")
	flag.Parse()
	if *streamsServe || *streamsSideArg != "" {
		err := streamsServer
		if *streamsSideArg != "" {
			err = func() error { return streamsSide(*streamsSideArg) }
		}
		if err := err(); err != nil {
			fmt.Fprintln(os.Stderr, "bench streams:", err)
			os.Exit(1)
		}
		return
	}
	if *worker != "" {
		if err := ceilingWorker(*worker); err != nil {
			fmt.Fprintln(os.Stderr, "bench worker:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(opts{quick: *quick, bigRows: *bigRows, tokenIDs: *tokenIDs, streamRounds: *streamRounds}, *only); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(o opts, only string) error {
	selected, err := selectCases(only)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	dir, err := os.MkdirTemp("", "regen-bench-")
	if err != nil {
		return fmt.Errorf("scratch dir: %w", err)
	}
	defer os.RemoveAll(dir)
	defer pgStop()

	printMachine(o.quick)
	o.dir = dir
	start := time.Now()
	var rows []row
	var details []string
	for _, c := range selected {
		t0 := time.Now()
		fmt.Fprintf(os.Stderr, "running %s...\n", c.name)
		out, err := c.run(ctx, o)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		rows = append(rows, out.rows...)
		for _, d := range out.detail {
			details = append(details, c.name+": "+d)
		}
		details = append(details, fmt.Sprintf("%s: case took %.1f s", c.name, time.Since(t0).Seconds()))
	}
	printTable(rows)
	fmt.Println()
	for _, d := range details {
		fmt.Println("  " + d)
	}
	fmt.Printf("\ntotal %.1f s; load average after: %s\n", time.Since(start).Seconds(), loadAvg())
	return nil
}

func selectCases(only string) ([]benchCase, error) {
	if only == "" {
		return slices.DeleteFunc(slices.Clone(cases), func(c benchCase) bool { return c.name == "ceiling" || c.name == "streams" }), nil
	}
	var out []benchCase
	for _, name := range strings.Split(only, ",") {
		name = strings.TrimSpace(name)
		found := false
		for _, c := range cases {
			if c.name == name {
				out = append(out, c)
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown case %q (want llm, store, ingest, sim, e2e, scale, bigjob, capture, ceiling or streams)", name)
		}
	}
	return out, nil
}

func printMachine(quick bool) {
	mode := "full"
	if quick {
		mode = "quick"
	}
	fmt.Printf("regen bench (%s) %s\n", mode, time.Now().Format("2006-01-02 15:04 MST"))
	fmt.Printf("go %s %s/%s, GOMAXPROCS %d, NumCPU %d\n", runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0), runtime.NumCPU())
	fmt.Printf("cpu: %s\n", cpuModel())
	fmt.Printf("load average before: %s\n\n", loadAvg())
}

func printTable(rows []row) {
	for _, line := range renderTable(rows) {
		fmt.Println(line)
	}
}

// renderTable lays the rows out in columns. A row's ratio is withheld, the
// column saying why, when either side was runner-bound: it would measure
// the machine, not regen against its reference.
func renderTable(rows []row) []string {
	cells := [][]string{{"case", "regen", "reference", "ratio", "unit (better)", "bound (regen / ref)", "reference is"}}
	for _, r := range rows {
		ratio := "n/a"
		if r.ref != 0 {
			ratio = fmt.Sprintf("%.2fx", r.regen/r.ref)
		}
		bounds := ownCode
		if r.sides != nil {
			bounds = r.sides[0].Class + " / " + r.sides[1].Class
			if why := bound.Withheld(bound.Side{Name: "regen", Cell: r.sides[0]}, bound.Side{Name: "reference", Cell: r.sides[1]}); why != "" {
				ratio = why
			}
		}
		cells = append(cells, []string{r.name, num(r.regen), num(r.ref), ratio, r.unit + " (" + r.better + ")", bounds, r.note})
	}
	width := make([]int, len(cells[0]))
	for _, c := range cells {
		for i, s := range c {
			width[i] = max(width[i], utf8.RuneCountInString(s))
		}
	}
	// Names and notes read left to right; figures line up on the right.
	rightAligned := []bool{false, true, true, true, false, false, false}
	var out []string
	for _, c := range cells {
		var b strings.Builder
		for i, s := range c {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(s))
			if i > 0 {
				b.WriteString("  ")
			}
			if rightAligned[i] {
				b.WriteString(pad + s)
			} else if i < len(c)-1 {
				b.WriteString(s + pad)
			} else {
				b.WriteString(s)
			}
		}
		out = append(out, b.String())
	}
	return out
}

// sides pairs regen's cell with the reference's for a row.
func sides(regen, ref bound.Cell) *[2]bound.Cell { return &[2]bound.Cell{regen, ref} }

// boundDetail is the detail line giving what bound each named side.
func boundDetail(named ...bound.Side) string {
	var parts []string
	for _, s := range named {
		parts = append(parts, s.Name+" "+s.Cell.Evidence())
	}
	return "bound: " + strings.Join(parts, "; ")
}

// num prints a figure with three significant digits and thousands kept readable.
func num(v float64) string {
	switch a := abs(v); {
	case a >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case a >= 1e4:
		return fmt.Sprintf("%.1fk", v/1e3)
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func abs(v float64) float64 {
	if v < 0 {
		return -v
	}
	return v
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
