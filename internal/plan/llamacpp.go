package plan

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
)

// LlamaCpp names llama-server, which plan does not size.
const LlamaCpp Engine = "llamacpp"

// ErrLlamaCpp says what regen supports for llama-server instead of a plan.
var ErrLlamaCpp = errors.New("regen plan sizes SGLang and vLLM servers from a model's config.json; it does not plan llama-server (llamacpp). " +
	"llama-server sizes its own KV cache: run it with -c TOTAL --parallel SLOTS (each slot gets TOTAL/SLOTS tokens unless the cache is unified), " +
	"and regen reads total_slots and the slot's n_ctx from its /props: the pool is slots x n_ctx, concurrency: auto keeps the slots full with no queue, " +
	"and a prompt longer than a slot is dead-lettered before it is sent (docs/engines.md §13.3)")

// ggufMagic opens a GGUF model file (llama.cpp's weights), which is no config.json.
var ggufMagic = []byte("GGUF")

// isGGUF reports whether the file at path starts like a GGUF file; it
// reads four bytes, not the multi-gigabyte file.
func isGGUF(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, fmt.Errorf("read model config: %w", err)
	}
	defer f.Close()
	head := make([]byte, len(ggufMagic))
	if _, err := io.ReadFull(f, head); err != nil {
		return false, nil // too short to be GGUF; let the JSON decoder say what it is
	}
	return bytes.Equal(head, ggufMagic), nil
}
