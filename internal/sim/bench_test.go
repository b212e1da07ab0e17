package sim

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BenchmarkStream1000 runs 1,000 concurrent streaming clients against a
// server with a fast decode model and reports streamed tokens per second
// and per CPU-second of the whole process (clients included, so the
// server's own cost is lower than reported).
// At speed 20 each decode step is a separate write per stream (no
// coalescing); at 1000 the server batches tokens into fewer writes.
func BenchmarkStream1000(b *testing.B) {
	for _, speed := range []float64{20, 1000} {
		b.Run(fmt.Sprintf("speed=%g", speed), func(b *testing.B) { benchStream(b, speed) })
	}
}

func benchStream(b *testing.B, speed float64) {
	const streams, tokensPerReq = 1000, 200
	c := DefaultConfig()
	c.ModelName = "m"
	c.Speed = speed
	c.LoadTime, c.WarmupTime = 0, 0
	c.OutputMean = 1 << 30 // every request runs to max_tokens
	c.TruncateFraction = 0
	s, err := New(c, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	url, err := s.Start(context.Background(), "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	<-s.Ready()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: streams, MaxConnsPerHost: 0}}
	defer client.CloseIdleConnections()
	body := func(i int) string {
		return fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"bench %d"}],"max_tokens":%d,"stream":true}`, i, tokensPerReq)
	}
	var ru0, ru1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	start := time.Now()
	b.ResetTimer()
	var total int64
	var mu sync.Mutex
	for range b.N {
		var wg sync.WaitGroup
		for i := range streams {
			wg.Go(func() {
				n := streamCount(client, url, body(i))
				mu.Lock()
				total += int64(n)
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	b.StopTimer()
	wall := time.Since(start).Seconds()
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := tv(ru1.Utime) + tv(ru1.Stime) - tv(ru0.Utime) - tv(ru0.Stime)
	if total != int64(b.N*streams*tokensPerReq) {
		b.Fatalf("streamed %d tokens, want %d", total, b.N*streams*tokensPerReq)
	}
	b.ReportMetric(float64(total)/wall, "tokens/s")
	b.ReportMetric(float64(total)/cpu, "tokens/cpu-s")
	b.ReportMetric(cpu, "cpu-s")
}

func tv(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }

// streamCount reads an SSE stream cheaply and counts content chunks.
func streamCount(client *http.Client, url, body string) int {
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	br := bufio.NewReaderSize(resp.Body, 16<<10)
	n := 0
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return n
		}
		if bytes.HasPrefix(line, []byte("data: [DONE]")) {
			return n
		}
		if bytes.Contains(line, []byte(`"content":" `)) {
			n++
		}
	}
}
