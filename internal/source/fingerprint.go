package source

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/regen-dev/regen/internal/job"
)

// FileInfo identifies the content of one source file as read with one
// mapping, cheaply enough to check at every start of a job.
type FileInfo struct {
	Size        int64
	ModTime     time.Time
	Fingerprint string
}

// Sampled regions of a file: its head and tail, and evenly spaced blocks
// in between; together at most about 3 MiB of reads whatever the size.
const (
	fpEdge   = 1 << 20
	fpBlock  = 16 << 10
	fpBlocks = 64
)

// Fingerprint describes path as src maps it: size, modification time and a
// SHA-256 over the mapping, the size and sampled regions of the content.
// It does not read the whole file, so a same-size edit of an unsampled
// byte that also keeps the modification time would go unnoticed; any
// ordinary rewrite, append or truncation changes it.
func Fingerprint(src job.Source, path string) (FileInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return FileInfo{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return FileInfo{}, err
	}
	h := sha256.New()
	// The mapping decides which samples a file yields: a changed mapping is
	// a different input, even for the same bytes.
	m, _ := json.Marshal(struct {
		Partition, Format, Conversations, Messages, Prompt, System, SystemField, Tools, ID, Lane string
		Limit                                                                                    int
	}{src.Partition, src.Format, src.Conversations, src.Messages, src.Prompt, src.System, src.SystemField, src.Tools, src.ID, src.Lane, src.Limit})
	h.Write(m)
	if src.SamplesPerPrompt > 1 {
		// Written only then, so stores of jobs without it keep their entries.
		fmt.Fprintf(h, "samples_per_prompt=%d", src.SamplesPerPrompt)
	}
	size := st.Size()
	_ = binary.Write(h, binary.LittleEndian, size)
	buf := make([]byte, fpEdge)
	read := func(off, n int64) error {
		if off < 0 {
			n += off
			off = 0
		}
		if off+n > size {
			n = size - off
		}
		if n <= 0 {
			return nil
		}
		if _, err := f.ReadAt(buf[:n], off); err != nil && err != io.EOF {
			return fmt.Errorf("fingerprint %s: %w", path, err)
		}
		h.Write(buf[:n])
		return nil
	}
	if err := read(0, fpEdge); err != nil {
		return FileInfo{}, err
	}
	if size > 2*fpEdge {
		step := (size - 2*fpEdge) / (fpBlocks + 1)
		for i := int64(1); i <= fpBlocks && step > fpBlock; i++ {
			if err := read(fpEdge+i*step, fpBlock); err != nil {
				return FileInfo{}, err
			}
		}
	}
	if size > fpEdge {
		if err := read(max(size-fpEdge, fpEdge), fpEdge); err != nil {
			return FileInfo{}, err
		}
	}
	return FileInfo{Size: size, ModTime: st.ModTime(), Fingerprint: "v1:" + hex.EncodeToString(h.Sum(nil)[:16])}, nil
}
