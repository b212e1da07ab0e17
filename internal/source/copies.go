package source

import (
	"crypto/sha256"
	"encoding/binary"
	"strconv"

	"github.com/regen-dev/regen/internal/conversation"
)

// copyOf returns sample j of the k a row makes. With k <= 1 it is s
// itself, so ids and bodies stay those of a job without samples_per_prompt.
// Otherwise its id is s.ID + "#" + j and its body carries "seed": the seed
// the request sends, derived from that id so a re-run (or another worker)
// makes the same sample byte for byte.
func copyOf(s Sample, j, k int) Sample {
	if k <= 1 {
		return s
	}
	c := s
	c.ID = s.ID + "#" + strconv.Itoa(j)
	c.Copy = j
	c.Body = conversation.WithSeed(s.Body, Seed(c.ID))
	return c
}

// Seed is the sampling seed of the sample with this id: the first 31 bits
// of its SHA-256, a non-negative value every engine accepts (llama.cpp
// takes a uint32 and treats 0xFFFFFFFF as "random").
func Seed(id string) int64 {
	h := sha256.Sum256([]byte(id))
	return int64(binary.BigEndian.Uint32(h[:4]) >> 1)
}
