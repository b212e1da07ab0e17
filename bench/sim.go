package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/regen-dev/regen/bench/internal/bound"
	"github.com/regen-dev/regen/internal/sim"
)

const simStreams = 1000

// fastSim is a simulator whose decode step is a fixed step real time long
// whatever the batch, with room for every stream at once, so the bench
// measures the server's own cost rather than a model's pacing curve.
func fastSim(step time.Duration) sim.Config {
	c := sim.DefaultConfig()
	c.ModelName = "m"
	c.LoadTime, c.WarmupTime = 0, 0
	c.Speed = 50
	c.DecodeBase = step * 50
	c.DecodePerReq, c.DecodePerKToken = 0, 0
	c.PrefillBase, c.PrefillPerKToken = 50*time.Millisecond, 10*time.Millisecond
	c.KVTokens = 8_000_000
	c.MaxRunningRequests = 2048
	c.Reasoning = "never"
	c.Seed = 1
	return c
}

// startSim starts a simulator on 127.0.0.1 and waits until it is ready.
func startSim(ctx context.Context, c sim.Config) (*sim.Server, string, error) {
	s, err := sim.New(c, io.Discard)
	if err != nil {
		return nil, "", err
	}
	url, err := s.Start(ctx, "127.0.0.1:0")
	if err != nil {
		s.Close()
		return nil, "", err
	}
	select {
	case <-s.Ready():
	case <-ctx.Done():
		s.Close()
		return nil, "", ctx.Err()
	}
	return s, url, nil
}

var tokenMark = []byte(`"role":null,"content":"`)

// streamTokens posts one streaming request and counts content chunks with
// a bufio line scan: the cheapest client, the same for both servers.
func streamTokens(ctx context.Context, hc *http.Client, url string, body []byte, br *bufio.Reader) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	br.Reset(resp.Body)
	n := 0
	for {
		line, err := br.ReadSlice('\n')
		if bytes.Contains(line, tokenMark) {
			n++
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// fanOut runs simStreams concurrent streams of tokens each against url and
// returns the tokens read and the span it took.
func fanOut(ctx context.Context, url string, tokens int) (int64, span, error) {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: simStreams, DisableCompression: true}}
	defer hc.CloseIdleConnections()
	var total atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	s0 := startSpan()
	for i := range simStreams {
		wg.Go(func() {
			body := []byte(`{"model":"m","messages":[{"role":"user","content":"bench stream ` + strconv.Itoa(i) + `"}],"max_tokens":` + strconv.Itoa(tokens) + `,"stream":true}`)
			n, err := streamTokens(ctx, hc, url, body, bufio.NewReaderSize(nil, 4<<10))
			if err == nil && n != tokens {
				err = fmt.Errorf("stream %d: %d tokens, want %d", i, n, tokens)
			}
			if err != nil {
				once.Do(func() { firstErr = err })
			}
			total.Add(int64(n))
		})
	}
	wg.Wait()
	return total.Load(), s0.end(), firstErr
}

// clock broadcasts a tick every step to any number of waiting handlers.
type clock struct {
	mu    sync.Mutex
	ch    chan struct{}
	ticks atomic.Int64
}

func newClock(ctx context.Context, step time.Duration) *clock {
	c := &clock{ch: make(chan struct{})}
	go func() {
		t := time.NewTicker(step)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				c.ticks.Add(1)
				c.mu.Lock()
				close(c.ch)
				c.ch = make(chan struct{})
				c.mu.Unlock()
			}
		}
	}()
	return c
}

func (c *clock) next() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ch
}

// plainSSE is the reference server: it writes the chunks the simulator
// would, with no scheduler. With a nil clock it writes and flushes each
// chunk as fast as the connection takes it; with a clock it sends, at each
// tick, one token per tick since the stream began (several at once when it
// fell behind, as the simulator does).
func plainSSE(tokens int, clk *clock) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		base := []byte(`data: {"id":"0123456789abcdef0123456789abcdef","object":"chat.completion.chunk","created":` + strconv.FormatInt(time.Now().Unix(), 10) + `,"model":"m",`)
		const tail = `,"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}` + "\n\n"
		buf := append(append([]byte(nil), base...), `"choices":[{"index":0,"delta":{"role":"assistant","content":"","reasoning_content":null,"tool_calls":null}`+tail...)
		var start int64
		if clk != nil {
			start = clk.ticks.Load()
		}
		for sent := 0; sent < tokens; {
			if _, err := w.Write(buf); err != nil {
				return
			}
			if err := rc.Flush(); err != nil {
				return
			}
			buf = buf[:0]
			avail := sent + 1
			if clk != nil {
				select {
				case <-clk.next():
				case <-r.Context().Done():
					return
				}
				avail = int(clk.ticks.Load() - start)
			}
			for ; sent < min(avail, tokens); sent++ {
				buf = append(buf, base...)
				buf = append(buf, `"choices":[{"index":0,"delta":{"role":null,"content":" w`...)
				buf = strconv.AppendInt(buf, int64(sent), 10)
				buf = append(buf, `","reasoning_content":null,"tool_calls":null}`+tail...)
			}
		}
		buf = append(buf, base...)
		buf = append(buf, `"choices":[{"index":0,"delta":{"role":null,"content":null,"reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":"length","matched_stop":null}],"usage":null}`+"\n\n"+"data: [DONE]\n\n"...)
		w.Write(buf)
		rc.Flush()
	})
}

// benchSim compares streamed tokens per CPU-second of the simulator with
// 1,000 concurrent streaming clients against a plain handler writing the
// same chunks with no scheduler, read by the same clients: once unpaced
// and once paced by a bare ticker at the simulator's step.
func benchSim(ctx context.Context, o opts) (outcome, error) {
	step := 20 * time.Millisecond
	tokens := 200
	if o.quick {
		tokens = 50
	}
	c := fastSim(step)
	c.OutputMean = 1 << 30 // every request runs to max_tokens
	c.TruncateFraction = 0
	s, url, err := startSim(ctx, c)
	if err != nil {
		return outcome{}, fmt.Errorf("start sim: %w", err)
	}
	w := bound.StartWatch(ctx, bound.WatchConfig{URLs: []string{url}, Speed: c.Speed})
	gotSim, simSpan, err := fanOut(ctx, url, tokens)
	simCell := w.Stop()
	s.Close()
	if err != nil {
		return outcome{}, fmt.Errorf("sim streams: %w", err)
	}

	ref := httptest.NewServer(plainSSE(tokens, nil))
	w = bound.StartWatch(ctx, bound.WatchConfig{})
	gotRef, refSpan, err := fanOut(ctx, ref.URL, tokens)
	refCell := w.Stop()
	ref.Close()
	if err != nil {
		return outcome{}, fmt.Errorf("reference streams: %w", err)
	}

	cctx, stop := context.WithCancel(ctx)
	clk := newClock(cctx, step)
	paced := httptest.NewServer(plainSSE(tokens, clk))
	// The ticker's pace against the step asked of it: a ticker drops the
	// ticks a starved process is late for.
	w = bound.StartWatch(ctx, bound.WatchConfig{Speed: 1, Clock: func() float64 { return float64(clk.ticks.Load()) * step.Seconds() }})
	gotPaced, pacedSpan, err := fanOut(ctx, paced.URL, tokens)
	pacedCell := w.Stop()
	paced.Close()
	stop()
	if err != nil {
		return outcome{}, fmt.Errorf("paced reference streams: %w", err)
	}

	perCPU := func(n int64, s span) float64 { return float64(n) / s.cpu.Seconds() }
	wall := func(n int64, s span) string {
		return fmt.Sprintf("%.1f s (%.0f tokens/s)", s.wall.Seconds(), float64(n)/s.wall.Seconds())
	}
	return outcome{
		rows: []row{
			{name: "sim tokens per CPU", unit: "tokens/cpu-s", better: "higher", regen: perCPU(gotSim, simSpan), ref: perCPU(gotRef, refSpan), note: "httptest handler writing the same chunks, unpaced", sides: sides(simCell, refCell)},
			{name: "sim tokens per CPU, paced", unit: "tokens/cpu-s", better: "higher", regen: perCPU(gotSim, simSpan), ref: perCPU(gotPaced, pacedSpan), note: "same handler, one shared ticker at the sim's step", sides: sides(simCell, pacedCell)},
		},
		detail: []string{fmt.Sprintf("%d concurrent streams x %d tokens; sim decode step %v real (fixed, batch of %d); clients' CPU counted on all sides; wall: sim %s, unpaced %s, paced %s",
			simStreams, tokens, step, simStreams, wall(gotSim, simSpan), wall(gotRef, refSpan), wall(gotPaced, pacedSpan)),
			boundDetail(bound.Side{Name: "sim", Cell: simCell}, bound.Side{Name: "unpaced", Cell: refCell}, bound.Side{Name: "paced", Cell: pacedCell})},
	}, nil
}
