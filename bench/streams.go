package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/regen-dev/regen/internal/dispatch"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// The streams case holds 10,000 streams open at once (2,000 with -quick)
// and measures the memory each costs the process that holds them: the
// dispatcher with its SQLite store and client, against plain llm.Client
// loops that keep nothing (the reference). Each side runs in a process of
// its own (this binary again, -streams-side), as does the stand-in server
// (-streams-server), so a side's RSS is its own: the server answers every
// request with a long stream (a chunk of four words every 500 ms, 20 to 60
// chunks as the request's bytes hash), and each side sends twice as many
// requests as it holds streams, so the first answers end while the rest
// stream and the lane refills. Figures per stream: the plateau (median RSS
// above the side's start while every stream is open and none has ended)
// and the peak (VmHWM above the start, reset after the setup).

// streamsArgs configures one side's process.
type streamsArgs struct {
	Side    string // "regen" or "plain"
	URL     string
	Streams int
	Dir     string
}

// streamsReport is what a side's process prints at its end.
type streamsReport struct {
	Base, Plateau, Peak uint64 // RSS bytes: at the start, plateau and peak above Base
	PlateauSamples      int
	// At the sampled RSS peak: the Go heap in use, goroutine stacks, and the
	// number of goroutines; and the moment, in seconds after the start.
	PeakHeap, PeakStacks uint64
	PeakGoroutines       int
	PeakAt, FirstDoneAt  float64
	// EndFiles is the open file descriptors once every answer ended: the
	// connections kept for reuse, the store's files.
	EndFiles int
	Wall     float64
	Done     int64
}

const (
	streamsInterval  = 500 * time.Millisecond
	streamsMinChunks = 20
	streamsMaxChunks = 60
)

// streamsServer is the stand-in server process: it prints its URL and
// serves until its stdin closes.
func streamsServer() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(streamsAnswer)}
	go func() { _ = srv.Serve(ln) }()
	fmt.Println("http://" + ln.Addr().String())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return srv.Close()
}

const streamsRole = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
const streamsChunk = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" four words of text\"}}]}\n\n"

// streamsAnswer streams 20 to 60 chunks, one every streamsInterval, as
// the request's bytes hash.
func streamsAnswer(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		return
	}
	h := fnv.New32a()
	_, _ = io.Copy(h, r.Body)
	chunks := streamsMinChunks + int(h.Sum32()%(streamsMaxChunks-streamsMinChunks+1))
	w.Header().Set("Content-Type", "text/event-stream")
	f := w.(http.Flusher)
	_, _ = io.WriteString(w, streamsRole)
	f.Flush()
	t := time.NewTicker(streamsInterval)
	defer t.Stop()
	for range chunks {
		select {
		case <-r.Context().Done():
			return
		case <-t.C:
		}
		_, _ = io.WriteString(w, streamsChunk)
		f.Flush()
	}
	fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\ndata: [DONE]\n\n", chunks*4, chunks*4+20)
}

func streamsBody(i int) []byte {
	return fmt.Appendf(nil, `{"messages":[{"role":"user","content":"Sample %d: write a long essay about one idea from computer networking."}]}`, i)
}

// streamsSide is one side's process: set up, reset VmHWM, run, report.
func streamsSide(arg string) error {
	var a streamsArgs
	if err := json.Unmarshal([]byte(arg), &a); err != nil {
		return fmt.Errorf("side arguments: %w", err)
	}
	ctx := context.Background()
	client := llm.New(llm.Config{BaseURL: a.URL, MaxConns: a.Streams})
	defer client.Close()
	var run func() (inFlight func() int, done func() int64, wait func() error, err error)
	switch a.Side {
	case "regen":
		st, err := sqlite.Open(filepath.Join(a.Dir, "streams.db"))
		if err != nil {
			return err
		}
		defer st.Close()
		ns := make([]store.NewSample, 2*a.Streams)
		for i := range ns {
			ns[i] = store.NewSample{ID: fmt.Sprintf("p/%06d", i), Partition: "p", Lane: "long", Body: streamsBody(i), PromptTokens: 20, Origin: fmt.Sprintf("p.jsonl:%d", i+1)}
		}
		if _, err := st.Ingest(ctx, ns); err != nil {
			return fmt.Errorf("ingest: %w", err)
		}
		d, err := dispatch.New(dispatch.Config{Store: st, Owner: "bench", Model: "m",
			Lanes:     []dispatch.LaneConfig{{Name: "long", Concurrency: a.Streams, MaxTokens: 4096}},
			Endpoints: []dispatch.Endpoint{{URL: a.URL, Client: client}}})
		if err != nil {
			return err
		}
		run = func() (func() int, func() int64, func() error, error) {
			errc := make(chan error, 1)
			go func() { errc <- d.Run(ctx) }()
			return func() int { return d.Totals().InFlight },
				func() int64 { c := d.Counters(); return c.Done + c.Rejected },
				func() error { return <-errc }, nil
		}
	case "plain":
		run = func() (func() int, func() int64, func() error, error) { return plainStreams(ctx, client, a.Streams) }
	default:
		return fmt.Errorf("unknown side %q", a.Side)
	}
	runtime.GC()
	base, _ := resetPeakRSS()
	t0 := time.Now()
	inFlight, done, wait, err := run()
	if err != nil {
		return err
	}
	rep := streamsWatch(a.Streams, t0, base, inFlight, done)
	if err := wait(); err != nil {
		return err
	}
	rep.stop()
	r := rep.report
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		r.EndFiles = len(fds)
	}
	r.Wall, r.Done = time.Since(t0).Seconds(), done()
	r.Peak = peakRSS() - min(base, peakRSS())
	if r.Done != int64(2*a.Streams) {
		return fmt.Errorf("%s side finished %d requests, want %d", a.Side, r.Done, 2*a.Streams)
	}
	return json.NewEncoder(os.Stdout).Encode(r)
}

// plainStreams runs streams goroutines sending 2*streams requests in all
// with Chat and keeping nothing.
func plainStreams(ctx context.Context, client *llm.Client, streams int) (func() int, func() int64, func() error, error) {
	var next, inFlight, done atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	for range streams {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(2*streams) {
					return
				}
				inFlight.Add(1)
				_, err := client.Chat(ctx, llm.Request{Model: "m", Body: streamsBody(int(i)), MaxTokens: 4096}, func(int) {})
				inFlight.Add(-1)
				if err != nil {
					select {
					case errc <- err:
					default:
					}
					return
				}
				done.Add(1)
			}
		})
	}
	wait := func() error {
		wg.Wait()
		select {
		case err := <-errc:
			return fmt.Errorf("plain chat: %w", err)
		default:
			return nil
		}
	}
	return func() int { return int(inFlight.Load()) }, done.Load, wait, nil
}

// rssWatch samples RSS every 20 ms: the plateau while every stream is open
// and none has ended, and the process's state at the highest sample.
type rssWatch struct {
	report   streamsReport
	stopc    chan struct{}
	finished chan struct{}
}

func streamsWatch(streams int, t0 time.Time, base uint64, inFlight func() int, done func() int64) *rssWatch {
	w := &rssWatch{stopc: make(chan struct{}), finished: make(chan struct{})}
	w.report.Base = base
	go func() {
		defer close(w.finished)
		var plateau []uint64
		var top uint64
		var lastProfile time.Time
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.stopc:
				if len(plateau) > 0 {
					slices.Sort(plateau)
					w.report.Plateau = plateau[len(plateau)/2] - min(base, plateau[len(plateau)/2])
				}
				w.report.PlateauSamples = len(plateau)
				return
			case <-tick.C:
			}
			rss := procStatus("VmRSS")
			finished := done()
			if finished > 0 && w.report.FirstDoneAt == 0 {
				w.report.FirstDoneAt = time.Since(t0).Seconds()
			}
			if finished == 0 && inFlight() >= streams {
				plateau = append(plateau, rss)
			}
			if rss > top {
				top = rss
				if finished > 0 && time.Since(lastProfile) > 2*time.Second {
					lastProfile = time.Now()
					writeHeapProfile()
				}
				w.report.PeakHeap, w.report.PeakStacks = heapAndStacks()
				w.report.PeakGoroutines = runtime.NumGoroutine()
				w.report.PeakAt = time.Since(t0).Seconds()
			}
		}
	}()
	return w
}

// writeHeapProfile writes the heap profile to the file
// REGEN_STREAMS_HEAPPROFILE names, if any: the side's heap at its highest
// RSS once answers have begun to end (the refill), for pprof.
func writeHeapProfile() {
	path := os.Getenv("REGEN_STREAMS_HEAPPROFILE")
	if path == "" {
		return
	}
	f, err := os.Create(path + "." + os.Getenv("REGEN_STREAMS_SIDE"))
	if err != nil {
		return
	}
	defer f.Close()
	_ = pprof.Lookup("heap").WriteTo(f, 0)
}

func (w *rssWatch) stop() {
	close(w.stopc)
	<-w.finished
}

func heapAndStacks() (heap, stacks uint64) {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/stacks:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64()
}

// benchStreams runs the stand-in server and, for each round, the two sides
// one after the other.
func benchStreams(ctx context.Context, o opts) (outcome, error) {
	streams, rounds := 10000, 1
	if o.quick {
		streams = 2000
	}
	if o.streamRounds > 0 {
		rounds = o.streamRounds
	}
	self, err := os.Executable()
	if err != nil {
		return outcome{}, err
	}
	srv := exec.CommandContext(ctx, self, "-streams-server")
	stdin, err := srv.StdinPipe()
	if err != nil {
		return outcome{}, err
	}
	out, err := srv.StdoutPipe()
	if err != nil {
		return outcome{}, err
	}
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		return outcome{}, err
	}
	defer func() {
		stdin.Close()
		_ = srv.Wait()
	}()
	url, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		return outcome{}, fmt.Errorf("stand-in server: %w", err)
	}
	url = strings.TrimSpace(url)
	var runs [2][]streamsReport
	for r := range rounds {
		for i, side := range []string{"regen", "plain"} {
			dir := filepath.Join(o.dir, fmt.Sprintf("streams-%s-%d", side, r))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return outcome{}, err
			}
			rep, err := streamsRun(ctx, self, streamsArgs{Side: side, URL: url, Streams: streams, Dir: dir})
			if err != nil {
				return outcome{}, err
			}
			runs[i] = append(runs[i], rep)
		}
	}
	return streamsOutcome(runs, streams), nil
}

func streamsRun(ctx context.Context, self string, a streamsArgs) (streamsReport, error) {
	arg, _ := json.Marshal(a)
	cmd := exec.CommandContext(ctx, self, "-streams-side", string(arg))
	cmd.Env = append(os.Environ(), "REGEN_STREAMS_SIDE="+a.Side)
	cmd.Stderr = os.Stderr
	b, err := cmd.Output()
	if err != nil {
		return streamsReport{}, fmt.Errorf("%s side: %w", a.Side, err)
	}
	var rep streamsReport
	if err := json.Unmarshal(b, &rep); err != nil {
		return streamsReport{}, fmt.Errorf("%s side report %q: %w", a.Side, b, err)
	}
	return rep, nil
}

// streamsOutcome reports the medians over rounds, per stream in KiB, with
// every round's figures in the detail lines.
func streamsOutcome(runs [2][]streamsReport, streams int) outcome {
	perStream := func(reps []streamsReport, f func(streamsReport) uint64) float64 {
		v := make([]float64, len(reps))
		for i, r := range reps {
			v[i] = float64(f(r)) / 1024 / float64(streams)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	plateau := func(r streamsReport) uint64 { return r.Plateau }
	peak := func(r streamsReport) uint64 { return r.Peak }
	const note = "plain llm.Client loops keeping nothing, own process"
	o := outcome{rows: []row{
		{name: "streams RSS plateau", unit: "KiB/stream", better: "lower", regen: perStream(runs[0], plateau), ref: perStream(runs[1], plateau), note: note},
		{name: "streams RSS peak", unit: "KiB/stream", better: "lower", regen: perStream(runs[0], peak), ref: perStream(runs[1], peak), note: note},
	}}
	for i, side := range []string{"regen", "plain"} {
		for r, rep := range runs[i] {
			o.detail = append(o.detail, fmt.Sprintf("%s round %d: %d streams, %d requests in %.0f s; plateau %.1f KiB/stream over %d samples, peak %.1f KiB/stream at %.1f s (first answer ended at %.1f s; at the peak heap %.0f MiB, stacks %.0f MiB, %d goroutines); start RSS %.0f MiB, %d files open at the end",
				side, r, streams, rep.Done, rep.Wall, float64(rep.Plateau)/1024/float64(streams), rep.PlateauSamples, float64(rep.Peak)/1024/float64(streams),
				rep.PeakAt, rep.FirstDoneAt, float64(rep.PeakHeap)/mib, float64(rep.PeakStacks)/mib, rep.PeakGoroutines, float64(rep.Base)/mib, rep.EndFiles))
		}
	}
	return o
}
