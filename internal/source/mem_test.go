package source

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/job"
)

// writeShareGPT writes n ShareGPT rows of about 300 bytes each.
func writeShareGPT(tb testing.TB, path string, n int) {
	tb.Helper()
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	topics := []string{"binary search trees", "the French revolution", "sourdough starters", "TCP congestion control", "tax brackets"}
	for i := range n {
		fmt.Fprintf(w, `{"id":"row-%08d","conversations":[{"from":"system","value":"You are a careful assistant."},{"from":"human","value":"Please explain %s in simple terms, with one example. Request number %d."},{"from":"gpt","value":"Sure: here is a short explanation with an example that will be regenerated anyway."}]}`+"\n",
			i, topics[i%len(topics)], i)
	}
	if err := w.Flush(); err != nil {
		tb.Fatal(err)
	}
	if err := f.Close(); err != nil {
		tb.Fatal(err)
	}
}

// memPeak samples the heap in use and the process RSS until stopped.
type memPeak struct {
	stop      chan struct{}
	done      chan struct{}
	heap, rss uint64
}

func startMemPeak() *memPeak {
	p := &memPeak{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			p.sample()
			select {
			case <-p.stop:
				return
			case <-t.C:
			}
		}
	}()
	return p
}

func (p *memPeak) sample() {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	p.heap = max(p.heap, ms.HeapInuse)
	p.rss = max(p.rss, rssBytes())
}

// Stop ends sampling and returns the peaks in bytes.
func (p *memPeak) Stop() (heap, rss uint64) {
	close(p.stop)
	<-p.done
	p.sample()
	return p.heap, p.rss
}

// rssBytes reads VmRSS from /proc (0 where there is no /proc).
func rssBytes() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
			kb, _ := strconv.ParseUint(string(bytes.TrimSuffix(bytes.TrimSpace(v), []byte(" kB"))), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func benchSource() job.Source {
	return job.Source{Partition: "bench", Path: "rows.jsonl", Conversations: "conversations", ID: "id"}
}

func BenchmarkReadJSONL1M(b *testing.B) {
	const n = 1_000_000
	dir := b.TempDir()
	writeShareGPT(b, filepath.Join(dir, "rows.jsonl"), n)
	runtime.GC()
	rss0 := rssBytes()
	peak := startMemPeak()
	b.ResetTimer()
	for b.Loop() {
		good := 0
		_, err := Read(context.Background(), benchSource(), dir, func(Sample) error { good++; return nil }, func(r BadRow) error {
			return fmt.Errorf("unexpected bad row %+v", r)
		})
		if err != nil || good != n {
			b.Fatalf("Read: %d good, %v", good, err)
		}
	}
	b.StopTimer()
	heap, rss := peak.Stop()
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
	b.ReportMetric(float64(heap)/(1<<20), "peak-heap-MiB")
	b.ReportMetric(float64(rss-min(rss, rss0))/(1<<20), "rss-growth-MiB")
}

// TestMemoryFlat shows memory does not grow with rows: in one pass over a
// 1M-row file, the peak heap over rows 200k..1M stays near the peak over
// the first 200k rows.
func TestMemoryFlat(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("writes and reads a 300 MB file; skipped with -short and -race")
	}
	dir := t.TempDir()
	writeShareGPT(t, filepath.Join(dir, "rows.jsonl"), 1_000_000)
	runtime.GC()
	peak := startMemPeak()
	var h200, r200 uint64
	good := 0
	st, err := Read(context.Background(), benchSource(), dir, func(Sample) error {
		if good++; good == 200_000 {
			h200, r200 = peak.Stop()
			peak = startMemPeak()
		}
		return nil
	}, func(BadRow) error { return nil })
	h1m, r1m := peak.Stop()
	if err != nil || st.Good != 1_000_000 {
		t.Fatalf("Read: %+v, %v", st, err)
	}
	t.Logf("peak HeapInuse: first 200k rows %.1f MiB, rows 200k-1M %.1f MiB; peak RSS %.1f MiB, %.1f MiB",
		float64(h200)/(1<<20), float64(h1m)/(1<<20), float64(r200)/(1<<20), float64(r1m)/(1<<20))
	// Five times the rows must not mean materially more heap: allow GC slack, not growth.
	if h1m > h200*3/2+8<<20 {
		t.Errorf("peak heap grew with rows: %d bytes over 1M rows, %d over the first 200k", h1m, h200)
	}
}
