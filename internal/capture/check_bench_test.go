package capture

import (
	"crypto/sha256"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkCheckFile measures CheckFile on a 64 MB bf16 file (2048 tokens,
// 4 layers, 4096 hidden) against a plain sha256 of the same file, the two
// alternating in every iteration so that a machine shared with other work
// slows both alike: the ratio is what the header checks and the NaN/Inf
// scan cost on top of the hash that has to be computed anyway.
func BenchmarkCheckFile(b *testing.B) {
	sent := ids(2048)
	path := filepath.Join(b.TempDir(), "hs.safetensors")
	goodFile(sent, 4, 4096).write(b, path)
	st, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	var check, plain time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := CheckFile(path, sent, Expect{Layers: 4, Hidden: 4096, DType: "bf16"}); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		f, err := os.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			b.Fatal(err)
		}
		f.Close()
		_ = h.Sum(nil)
		check, plain = check+t1.Sub(t0), plain+time.Since(t1)
	}
	mb := float64(st.Size()) * float64(b.N) / 1e6
	b.ReportMetric(mb/check.Seconds(), "checkfile-MB/s")
	b.ReportMetric(mb/plain.Seconds(), "sha256-MB/s")
	b.ReportMetric(plain.Seconds()/check.Seconds(), "speed-ratio")
}

// BenchmarkFirstNonFinite measures the NaN/Inf scan alone on 64 MB of
// finite bf16 elements held in memory.
func BenchmarkFirstNonFinite(b *testing.B) {
	data := make([]byte, 64<<20)
	for i := 0; i < len(data); i += 2 {
		data[i], data[i+1] = byte(i), 0x3F // 1.x, finite
	}
	f := formats["bf16"]
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if i := f.firstNonFinite(data); i >= 0 {
			b.Fatalf("element %d reported non-finite", i)
		}
	}
}
