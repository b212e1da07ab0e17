package capture

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/nlpodyssey/safetensors"
	"golang.org/x/sys/unix"
)

// Shape is a hidden-state file's [seq, layers, hidden].
type Shape struct{ Tokens, Layers, Hidden int }

// Expect is what a file must hold beyond the token ids; a zero field
// accepts what the file says (the caller fixes it from the first file).
type Expect struct {
	Layers, Hidden int
	DType          string
}

// FileInfo is what a checked file holds: its size and sha256 over every
// byte, and the shape and dtype of its hidden_states tensor.
type FileInfo struct {
	Bytes  int64
	SHA256 string
	Shape  Shape
	DType  string
}

// The kinds of FileError: what is wrong with a hidden-state file.
const (
	KindMissing   = "missing"
	KindTruncated = "truncated"
	KindHeader    = "header"
	KindDType     = "dtype"
	KindShape     = "shape"
	KindTokenIDs  = "token_ids"
	KindNaN       = "nan"
	KindInf       = "inf"
)

// FileError says why a hidden-state file was refused. Kind is one of the
// Kind constants; Detail names the field, index or element.
type FileError struct {
	Path, Kind, Detail string
}

func (e *FileError) Error() string {
	return fmt.Sprintf("hidden states %s: %s: %s", e.Path, e.Kind, e.Detail)
}

// Tensor names of the vLLM hidden-states connector's file.
const (
	tokenIDsTensor     = "token_ids"
	hiddenStatesTensor = "hidden_states"
)

// NormalizeDType maps a dtype as a server, torch or safetensors spells it
// (BF16, bfloat16, torch.float16, float32...) to regen's name: bf16, f16
// or f32. ok is false for any other dtype.
func NormalizeDType(s string) (name string, ok bool) {
	switch strings.TrimPrefix(strings.ToLower(strings.TrimSpace(s)), "torch.") {
	case "bf16", "bfloat16":
		return "bf16", true
	case "f16", "fp16", "float16", "half":
		return "f16", true
	case "f32", "fp32", "float32", "float":
		return "f32", true
	}
	return "", false
}

// DTypeBytes is the size of one element of a dtype regen accepts (0 for
// any other).
func DTypeBytes(dtype string) int {
	switch name, _ := NormalizeDType(dtype); name {
	case "bf16", "f16":
		return 2
	case "f32":
		return 4
	}
	return 0
}

// CheckFile reads a hidden-state file written by the server and checks it
// against the token ids sent: a header that parses and covers the file
// exactly, token_ids equal to wantIDs, hidden_states of shape
// [len(wantIDs), layers, hidden] in bf16, f16 or f32 as want says, and no
// NaN or Inf. It returns the file's size and sha256 (over every byte).
// The file is mapped, not read onto the heap; the scan works on the raw
// bits. A problem with the file is a *FileError; an I/O error (permission)
// is returned wrapped.
func CheckFile(path string, wantIDs []int64, want Expect) (FileInfo, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return FileInfo{}, &FileError{Path: path, Kind: KindMissing, Detail: "no such file"}
	}
	if err != nil {
		return FileInfo{}, fmt.Errorf("check hidden states: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return FileInfo{}, fmt.Errorf("check hidden states %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return FileInfo{}, &FileError{Path: path, Kind: KindMissing, Detail: "not a regular file"}
	}
	if st.Size() < 8 {
		return FileInfo{}, &FileError{Path: path, Kind: KindTruncated, Detail: fmt.Sprintf("%d bytes, shorter than the 8-byte header length", st.Size())}
	}
	buf, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return FileInfo{}, fmt.Errorf("check hidden states %s: map %d bytes: %w", path, st.Size(), err)
	}
	defer unix.Munmap(buf)
	_ = unix.Madvise(buf, unix.MADV_SEQUENTIAL) // a hint: the scan reads once, front to back
	return checkMapped(path, buf, wantIDs, want)
}

// checkMapped checks a file's bytes. A file cut shorter while mapped
// faults on access (SIGBUS): the fault becomes a truncated error, not a
// crash of the whole run.
func checkMapped(path string, buf []byte, wantIDs []int64, want Expect) (info FileInfo, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			var fault interface{ Addr() uintptr }
			if e, ok := r.(error); ok && errors.As(e, &fault) {
				info, err = FileInfo{}, &FileError{Path: path, Kind: KindTruncated, Detail: fmt.Sprintf("file cut shorter while being read (%v)", r)}
				return
			}
			panic(r)
		}
	}()
	all, err := parseFile(path, buf)
	if err != nil {
		return FileInfo{}, err
	}
	ids, hs, err := tensors(path, all)
	if err != nil {
		return FileInfo{}, err
	}
	info.Shape, info.DType, err = checkLayout(path, ids, hs, len(wantIDs), want)
	if err != nil {
		return FileInfo{}, err
	}
	if err := checkTokenIDs(path, ids, wantIDs); err != nil {
		return FileInfo{}, err
	}
	sum, err := hashAndScan(path, buf, hs, info.Shape, info.DType)
	if err != nil {
		return FileInfo{}, err
	}
	info.Bytes, info.SHA256 = int64(len(buf)), sum
	return info, nil
}

// tensor is one tensor of a mapped file: where its bytes start in the
// file, and the bytes themselves.
type tensor struct {
	dtype safetensors.DType
	shape []uint64
	start int
	data  []byte
}

// parseFile parses the safetensors header, telling a file cut short
// (truncated: the header or the data it declares end past the file) from
// one that does not parse or declares less than the file holds (header).
func parseFile(path string, buf []byte) (map[string]tensor, error) {
	n := binary.LittleEndian.Uint64(buf[:8])
	size := uint64(len(buf))
	if n > size-8 && n < 100_000_000 {
		return nil, &FileError{Path: path, Kind: KindTruncated, Detail: fmt.Sprintf("header declares %d bytes, file has %d after the length", n, size-8)}
	}
	_, md, err := safetensors.ReadMetadata(buf)
	if err != nil {
		if n <= size-8 && json.Unmarshal(buf[8:8+n], &md) == nil {
			end := uint64(0)
			for _, t := range md.Tensors() {
				end = max(end, t.DataOffsets[1])
			}
			if want := 8 + n + end; want > size {
				return nil, &FileError{Path: path, Kind: KindTruncated, Detail: fmt.Sprintf("%d bytes, header declares %d", size, want)}
			}
		}
		return nil, &FileError{Path: path, Kind: KindHeader, Detail: err.Error()}
	}
	out := make(map[string]tensor)
	for name, t := range md.Tensors() {
		// ReadMetadata checked the offsets: contiguous and inside the file.
		s, e := int(8+n+t.DataOffsets[0]), int(8+n+t.DataOffsets[1])
		out[name] = tensor{dtype: t.DType, shape: t.Shape, start: s, data: buf[s:e]}
	}
	return out, nil
}

func tensors(path string, all map[string]tensor) (ids, hs tensor, err error) {
	names := func() string {
		var n []string
		for k := range all {
			n = append(n, k)
		}
		slices.Sort(n)
		return strings.Join(n, ", ")
	}
	ids, ok := all[tokenIDsTensor]
	if !ok {
		return ids, hs, &FileError{Path: path, Kind: KindHeader, Detail: fmt.Sprintf("no %s tensor (has %s)", tokenIDsTensor, names())}
	}
	hs, ok = all[hiddenStatesTensor]
	if !ok {
		return ids, hs, &FileError{Path: path, Kind: KindHeader, Detail: fmt.Sprintf("no %s tensor (has %s)", hiddenStatesTensor, names())}
	}
	return ids, hs, nil
}

// checkLayout checks both tensors' dtypes and shapes against the sent ids
// and want; it returns hidden_states' shape and dtype name.
func checkLayout(path string, ids, hs tensor, seq int, want Expect) (Shape, string, error) {
	if ids.dtype != safetensors.I64 {
		return Shape{}, "", &FileError{Path: path, Kind: KindDType, Detail: fmt.Sprintf("%s is %s, want I64", tokenIDsTensor, ids.dtype)}
	}
	dtype, ok := NormalizeDType(hs.dtype.String())
	if !ok {
		return Shape{}, "", &FileError{Path: path, Kind: KindDType, Detail: fmt.Sprintf("%s is %s, want BF16, F16 or F32", hiddenStatesTensor, hs.dtype)}
	}
	if wantName, _ := NormalizeDType(want.DType); want.DType != "" && wantName != dtype {
		return Shape{}, "", &FileError{Path: path, Kind: KindDType, Detail: fmt.Sprintf("%s is %s, want %s", hiddenStatesTensor, dtype, want.DType)}
	}
	if s := ids.shape; len(s) != 1 || s[0] != uint64(seq) {
		return Shape{}, "", &FileError{Path: path, Kind: KindShape, Detail: fmt.Sprintf("%s has shape %v, want [%d] (the ids sent)", tokenIDsTensor, s, seq)}
	}
	s := hs.shape
	if len(s) != 3 || s[0] != uint64(seq) {
		return Shape{}, "", &FileError{Path: path, Kind: KindShape, Detail: fmt.Sprintf("%s has shape %v, want [%d, layers, hidden]", hiddenStatesTensor, s, seq)}
	}
	shape := Shape{Tokens: seq, Layers: int(s[1]), Hidden: int(s[2])}
	if want.Layers != 0 && shape.Layers != want.Layers || want.Hidden != 0 && shape.Hidden != want.Hidden {
		return Shape{}, "", &FileError{Path: path, Kind: KindShape, Detail: fmt.Sprintf("%s has shape %v, want [%d, %d, %d]", hiddenStatesTensor, s, seq, want.Layers, want.Hidden)}
	}
	return shape, dtype, nil
}

func checkTokenIDs(path string, ids tensor, want []int64) error {
	for i, w := range want {
		if got := int64(binary.LittleEndian.Uint64(ids.data[8*i:])); got != w {
			return &FileError{Path: path, Kind: KindTokenIDs, Detail: fmt.Sprintf("token %d is %d in the file, %d was sent", i, got, w)}
		}
	}
	return nil
}

// scanChunk is how much of hidden_states is hashed and then scanned at a
// time: small enough to still be in cache for the second pass.
const scanChunk = 256 << 10

// hashAndScan hashes the whole file and scans hidden_states for NaN/Inf
// in one pass over memory, chunk by chunk.
func hashAndScan(path string, buf []byte, hs tensor, shape Shape, dtype string) (string, error) {
	h := sha256.New()
	h.Write(buf[:hs.start])
	f := formats[dtype]
	for off := 0; off < len(hs.data); off += scanChunk {
		chunk := hs.data[off:min(off+scanChunk, len(hs.data))]
		h.Write(chunk)
		if i := f.firstNonFinite(chunk); i >= 0 {
			return "", nonFinite(path, f, chunk[i*f.size:], off/f.size+i, shape)
		}
	}
	h.Write(buf[hs.start+len(hs.data):])
	return hex.EncodeToString(h.Sum(nil)), nil
}
