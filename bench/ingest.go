package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/source"
)

// writePromptJSONL writes n rows of about 260 bytes with an id and a prompt.
func writePromptJSONL(path string, n int) (int64, error) {
	topics := []string{"binary search trees", "the French revolution", "sourdough starters", "TCP congestion control", "tax brackets", "photosynthesis", `the \"CAP\" theorem`}
	return writeJSONL(path, n, func(w io.Writer, i int) {
		fmt.Fprintf(w, `{"id":"row-%08d","prompt":"Please explain %s in simple terms, with one worked example and a short summary at the end. Keep it under three paragraphs. Request number %d.","source":"bench","score":%d}`+"\n",
			i, topics[i%len(topics)], i, i%100)
	})
}

// benchIngest compares source.Read on a generated JSONL file with a bufio
// line scan that checks each line is valid JSON: the least any reader that
// rejects broken rows must do.
func benchIngest(ctx context.Context, o opts) (outcome, error) {
	rows := 1_000_000
	if o.quick {
		rows = 200_000
	}
	path := filepath.Join(o.dir, "prompts.jsonl")
	size, err := writePromptJSONL(path, rows)
	if err != nil {
		return outcome{}, fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(path)

	src := job.Source{Partition: "p", Path: path, Prompt: "prompt", ID: "id"}
	regen := func() (int, error) { return readSource(ctx, src) }
	ref := func() (int, error) { return countValidJSONLines(path) }
	// Warm the page cache so neither side pays the first read from disk.
	if _, err := ref(); err != nil {
		return outcome{}, fmt.Errorf("reference: %w", err)
	}
	g, err := measureRead(rows, regen)
	if err != nil {
		return outcome{}, fmt.Errorf("source.Read: %w", err)
	}
	r, err := measureRead(rows, ref)
	if err != nil {
		return outcome{}, fmt.Errorf("reference: %w", err)
	}
	const note = "bufio line scan + json.Valid per line"
	out := outcome{
		rows: []row{
			{name: "ingest rows", unit: "rows/s", better: "higher", regen: g.rate, ref: r.rate, note: note},
			{name: "ingest peak heap", unit: "MiB HeapInuse", better: "lower", regen: float64(g.heap) / mib, ref: float64(r.heap) / mib, note: note},
		},
		detail: []string{fmt.Sprintf("%d rows, %.0f MiB JSONL (prompt + id mapping); heap = peak runtime HeapInuse above the post-GC baseline, sampled every 5 ms", rows, float64(size)/mib)},
	}
	if g.rssReset && r.rssReset {
		out.rows = append(out.rows, row{name: "ingest peak RSS", unit: "MiB above start", better: "lower", regen: float64(g.rss) / mib, ref: float64(r.rss) / mib, note: note + " (VmHWM reset per side)"})
	} else {
		out.detail = append(out.detail, peakRSSUnavailable())
	}
	return out, nil
}

// readSource is regen's side: source.Read of the whole file, every row
// expected good.
func readSource(ctx context.Context, src job.Source) (int, error) {
	good, bad := 0, 0
	st, err := source.Read(ctx, src, "", func(s source.Sample) error {
		if len(s.Body) == 0 || s.ID == "" {
			return errors.New("empty sample")
		}
		good++
		return nil
	}, func(source.BadRow) error { bad++; return nil })
	if err != nil {
		return 0, err
	}
	if bad != 0 || st.Good != good {
		return 0, fmt.Errorf("read %d good and %d bad rows (stats %+v)", good, bad, st)
	}
	return good, nil
}

// countValidJSONLines is the reference: it splits path into lines and
// counts those that are valid JSON.
func countValidJSONLines(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 64<<10)
	var long []byte
	n := 0
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			long = append(long[:0], line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = br.ReadSlice('\n')
				long = append(long, line...)
			}
			line = long
		}
		if len(line) > 0 && json.Valid(line) {
			n++
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return 0, err
		}
	}
}

// readFigures are one side's rate and memory.
type readFigures struct {
	rate      float64
	heap, rss uint64
	rssReset  bool
}

// measureRead runs fn once, which must read rows rows, and measures its
// rate, peak heap and peak RSS.
func measureRead(rows int, fn func() (int, error)) (readFigures, error) {
	_, reset := resetPeakRSS()
	rss0 := procStatus("VmRSS")
	hp := startHeapPeak()
	s0 := startSpan()
	n, err := fn()
	sp := s0.end()
	heap := hp.Stop()
	if err != nil {
		return readFigures{}, err
	}
	if n != rows {
		return readFigures{}, fmt.Errorf("read %d rows, want %d", n, rows)
	}
	return readFigures{rate: float64(n) / sp.wall.Seconds(), heap: heap, rss: peakRSS() - min(rss0, peakRSS()), rssReset: reset}, nil
}
