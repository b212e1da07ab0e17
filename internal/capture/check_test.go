package capture

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nlpodyssey/safetensors"
	"golang.org/x/sys/unix"
)

// hsFile describes a hidden-state file a test writes with the library.
type hsFile struct {
	ids      []int64 // token_ids as written
	shape    []uint64
	dtype    safetensors.DType
	idsDType safetensors.DType
	poison   map[int]uint64 // element index -> raw bits written there
	omit     string         // a tensor left out
}

func goodFile(ids []int64, layers, hidden int) hsFile {
	return hsFile{ids: ids, shape: []uint64{uint64(len(ids)), uint64(layers), uint64(hidden)}, dtype: safetensors.BF16, idsDType: safetensors.I64}
}

// write writes f with safetensors.SerializeToWriter; the hidden states are
// finite values from a seeded generator, except the poisoned elements.
func (f hsFile) write(t testing.TB, path string) {
	t.Helper()
	size := int(f.dtype.Size())
	n := 1
	for _, d := range f.shape {
		n *= int(d)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, n*size)
	for i := 0; i < n; i++ {
		v := float32(rng.NormFloat64())
		put(data[i*size:], size, f.dtype, math.Float32bits(v))
	}
	for i, bits := range f.poison {
		putRaw(data[i*size:], size, bits)
	}
	hs, err := safetensors.NewTensorView(f.dtype, f.shape, data)
	if err != nil {
		t.Fatal(err)
	}
	isz := int(f.idsDType.Size())
	idb := make([]byte, len(f.ids)*isz)
	for i, id := range f.ids {
		putRaw(idb[i*isz:], isz, uint64(id))
	}
	ids, err := safetensors.NewTensorView(f.idsDType, []uint64{uint64(len(f.ids))}, idb)
	if err != nil {
		t.Fatal(err)
	}
	all := map[string]safetensors.TensorView{"token_ids": ids, "hidden_states": hs}
	delete(all, f.omit)
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := safetensors.SerializeToWriter(all, nil, out); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// put writes a float32's bits as dtype: bf16 keeps the top half, f16 is
// written as a small finite value of the same sign.
func put(b []byte, size int, dtype safetensors.DType, f32 uint32) {
	switch dtype {
	case safetensors.BF16:
		putRaw(b, size, uint64(f32>>16))
	case safetensors.F16:
		putRaw(b, size, uint64(f32>>16&0x8000|0x3C00|f32>>13&0x3FF)) // sign, exponent 0 (1.x), mantissa
	default:
		putRaw(b, size, uint64(f32)) // F32, and the F64 of the wrong-dtype case (finite either way)
	}
}

func putRaw(b []byte, size int, v uint64) {
	switch size {
	case 2:
		binary.LittleEndian.PutUint16(b, uint16(v))
	case 4:
		binary.LittleEndian.PutUint32(b, uint32(v))
	case 8:
		binary.LittleEndian.PutUint64(b, v)
	}
}

func ids(n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(1000 + 7*i)
	}
	return out
}

func TestCheckFile(t *testing.T) {
	sent := ids(12)
	withIDs := func(f hsFile, ids []int64) hsFile { f.ids = ids; return f }
	with := func(mod func(*hsFile)) hsFile { f := goodFile(sent, 3, 40); mod(&f); return f }
	otherIDs := append([]int64(nil), sent...)
	otherIDs[7] = 5
	cases := []struct {
		name      string
		file      *hsFile // nil: no file
		cut       int     // bytes cut from the end after writing
		extra     int     // bytes appended after writing
		raw       []byte  // written instead of a file
		want      Expect
		kind      string
		detail    string
		wantShape Shape
		wantDType string
	}{
		{name: "good bf16", file: ptr(goodFile(sent, 3, 40)), wantShape: Shape{12, 3, 40}, wantDType: "bf16"},
		{name: "good bf16 expected", file: ptr(goodFile(sent, 3, 40)), want: Expect{Layers: 3, Hidden: 40, DType: "bfloat16"}, wantShape: Shape{12, 3, 40}, wantDType: "bf16"},
		{name: "good f16", file: ptr(with(func(f *hsFile) { f.dtype = safetensors.F16 })), wantShape: Shape{12, 3, 40}, wantDType: "f16"},
		{name: "good f32", file: ptr(with(func(f *hsFile) { f.dtype = safetensors.F32 })), want: Expect{DType: "F32"}, wantShape: Shape{12, 3, 40}, wantDType: "f32"},
		{name: "missing", kind: KindMissing, detail: "no such file"},
		{name: "truncated data", file: ptr(goodFile(sent, 3, 40)), cut: 100, kind: KindTruncated, detail: "header declares"},
		{name: "truncated in header", raw: []byte{200, 0, 0, 0, 0, 0, 0, 0, '{', '"'}, kind: KindTruncated, detail: "header declares 200 bytes"},
		{name: "empty", raw: []byte{}, kind: KindTruncated, detail: "0 bytes"},
		{name: "trailing bytes", file: ptr(goodFile(sent, 3, 40)), extra: 10, kind: KindHeader, detail: "metadata incomplete buffer"},
		{name: "truncated before length", raw: []byte{1, 2, 3}, kind: KindTruncated, detail: "3 bytes"},
		{name: "header garbage", raw: append([]byte{8, 0, 0, 0, 0, 0, 0, 0}, "not json"...), kind: KindHeader, detail: "invalid header"},
		{name: "header too large", raw: []byte{0, 0, 0, 0, 1, 0, 0, 0, 0}, kind: KindHeader, detail: "header too large"},
		{name: "no token_ids", file: ptr(with(func(f *hsFile) { f.omit = "token_ids" })), kind: KindHeader, detail: "no token_ids tensor (has hidden_states)"},
		{name: "no hidden_states", file: ptr(with(func(f *hsFile) { f.omit = "hidden_states" })), kind: KindHeader, detail: "no hidden_states tensor (has token_ids)"},
		{name: "NaN", file: ptr(with(func(f *hsFile) { f.poison = map[int]uint64{(5*3+1)*40 + 17: 0x7FC0} })), kind: KindNaN, detail: "hidden_states[5, 1, 17] (element 657) is NaN (bf16 bits 0x7fc0)"},
		{name: "first of two NaN", file: ptr(with(func(f *hsFile) { f.poison = map[int]uint64{1400: 0xFF81, 900: 0x7F81} })), kind: KindNaN, detail: "hidden_states[7, 1, 20] (element 900)"},
		{name: "Inf", file: ptr(with(func(f *hsFile) { f.poison = map[int]uint64{3: 0x7F80} })), kind: KindInf, detail: "hidden_states[0, 0, 3] (element 3) is Inf"},
		{name: "-Inf last element", file: ptr(with(func(f *hsFile) { f.poison = map[int]uint64{12*3*40 - 1: 0xFF80} })), kind: KindInf, detail: "hidden_states[11, 2, 39]"},
		{name: "f16 NaN", file: ptr(with(func(f *hsFile) { f.dtype = safetensors.F16; f.poison = map[int]uint64{50: 0x7E00} })), kind: KindNaN, detail: "hidden_states[0, 1, 10] (element 50) is NaN (f16 bits 0x7e00)"},
		{name: "f32 Inf", file: ptr(with(func(f *hsFile) { f.dtype = safetensors.F32; f.poison = map[int]uint64{121: 0xFF800000} })), kind: KindInf, detail: "hidden_states[1, 0, 1] (element 121) is Inf (f32 bits 0xff800000)"},
		{name: "wrong ids", file: ptr(withIDs(goodFile(sent, 3, 40), otherIDs)), kind: KindTokenIDs, detail: "token 7 is 5 in the file, 1049 was sent"},
		{name: "fewer tokens", file: ptr(goodFile(sent[:11], 3, 40)), kind: KindShape, detail: "token_ids has shape [11], want [12]"},
		{name: "seq differs", file: ptr(with(func(f *hsFile) { f.shape = []uint64{11, 3, 40} })), kind: KindShape, detail: "hidden_states has shape [11 3 40], want [12, layers, hidden]"},
		{name: "rank 2", file: ptr(with(func(f *hsFile) { f.shape = []uint64{12, 120} })), kind: KindShape, detail: "hidden_states has shape [12 120]"},
		{name: "layers differ", file: ptr(goodFile(sent, 3, 40)), want: Expect{Layers: 4}, kind: KindShape, detail: "hidden_states has shape [12 3 40], want [12, 4, 0]"},
		{name: "hidden differs", file: ptr(goodFile(sent, 3, 40)), want: Expect{Layers: 3, Hidden: 64}, kind: KindShape, detail: "want [12, 3, 64]"},
		{name: "f64 states", file: ptr(with(func(f *hsFile) { f.dtype = safetensors.F64 })), kind: KindDType, detail: "hidden_states is F64, want BF16, F16 or F32"},
		{name: "dtype not expected", file: ptr(with(func(f *hsFile) { f.dtype = safetensors.F32 })), want: Expect{DType: "bf16"}, kind: KindDType, detail: "hidden_states is f32, want bf16"},
		{name: "i32 ids", file: ptr(with(func(f *hsFile) { f.idsDType = safetensors.I32 })), kind: KindDType, detail: "token_ids is I32, want I64"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "hs.safetensors")
			switch {
			case c.file != nil:
				c.file.write(t, path)
			case c.raw != nil:
				if err := os.WriteFile(path, c.raw, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if c.cut > 0 {
				st, _ := os.Stat(path)
				if err := os.Truncate(path, st.Size()-int64(c.cut)); err != nil {
					t.Fatal(err)
				}
			}
			if c.extra > 0 {
				f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				f.Write(make([]byte, c.extra))
				f.Close()
			}
			info, err := CheckFile(path, sent, c.want)
			if c.kind == "" {
				if err != nil {
					t.Fatalf("CheckFile: %v, want no error", err)
				}
				b, _ := os.ReadFile(path)
				sum := sha256.Sum256(b)
				want := FileInfo{Bytes: int64(len(b)), SHA256: hex.EncodeToString(sum[:]), Shape: c.wantShape, DType: c.wantDType}
				if info != want {
					t.Fatalf("CheckFile = %+v, want %+v", info, want)
				}
				return
			}
			var fe *FileError
			if !errors.As(err, &fe) {
				t.Fatalf("CheckFile: %v (%T), want a *FileError of kind %q", err, err, c.kind)
			}
			if fe.Kind != c.kind || fe.Path != path || !strings.Contains(fe.Detail, c.detail) {
				t.Fatalf("CheckFile error = %q (kind %q), want kind %q, path %s, detail containing %q", err, fe.Kind, c.kind, path, c.detail)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestCheckFileCutWhileMapped cuts a file after it is mapped: reading the
// lost pages faults (SIGBUS), which must come back as a truncated error
// and not crash the process.
func TestCheckFileCutWhileMapped(t *testing.T) {
	sent := ids(64)
	path := filepath.Join(t.TempDir(), "hs.safetensors")
	goodFile(sent, 4, 512).write(t, path) // 256 KB of states: many pages
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	buf, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	if err := os.Truncate(path, 4096); err != nil {
		t.Fatal(err)
	}
	_, err = checkMapped(path, buf, sent, Expect{})
	var fe *FileError
	if !errors.As(err, &fe) || fe.Kind != KindTruncated || !strings.Contains(fe.Detail, "cut shorter while being read") {
		t.Fatalf("checkMapped on a file cut to 4096 bytes: %v, want a truncated FileError", err)
	}
}

// TestFirstNonFinite compares the word-at-a-time scan with a per-element
// oracle (math.IsNaN/IsInf on the converted value for bf16 and f32) on
// random bit patterns, where about one bf16 element in 256 is NaN or Inf.
func TestFirstNonFinite(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	oracle := map[string]func(uint64) bool{
		"bf16": func(b uint64) bool {
			v := float64(math.Float32frombits(uint32(b) << 16))
			return math.IsNaN(v) || math.IsInf(v, 0)
		},
		"f32": func(b uint64) bool {
			v := float64(math.Float32frombits(uint32(b)))
			return math.IsNaN(v) || math.IsInf(v, 0)
		},
		"f16": func(b uint64) bool { return b>>10&0x1F == 0x1F },
	}
	for name, f := range formats {
		hits := 0
		for trial := 0; trial < 3000; trial++ {
			n := rng.IntN(80)
			b := make([]byte, n*f.size)
			want := -1
			for i := 0; i < n; i++ {
				bits := rng.Uint64()
				if f.size == 4 && rng.IntN(8) == 0 {
					bits |= f.exponent // f32 random bits are rarely non-finite: force some
				}
				putRaw(b[i*f.size:], f.size, bits)
				if want < 0 && oracle[name](f.element(b[i*f.size:])) {
					want = i
				}
			}
			if got := f.firstNonFinite(b); got != want {
				t.Fatalf("%s trial %d: firstNonFinite = %d, oracle says %d (bytes %x)", name, trial, got, want, b)
			}
			if want >= 0 {
				hits++
			}
		}
		if hits < 100 {
			t.Fatalf("%s: only %d of 3000 trials had a NaN/Inf: the test does not exercise the scan", name, hits)
		}
	}
}
