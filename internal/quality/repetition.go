package quality

import (
	"sync"
	"unicode"
	"unicode/utf8"
)

// Repeat is a degenerate loop FindRepetition found.
type Repeat struct {
	Text   string // the repeated run of words, as first written
	Words  int    // words in the run
	Offset int    // byte offset of its first occurrence
	Count  int    // occurrences counted when the threshold was passed
}

// FindRepetition reports the first run of n words (n <= 0: DefaultNGram)
// that occurs more than maxRepeats times in s. It runs in one pass, linear
// in len(s): each word is hashed once (FNV-1a), the n-gram hash is a
// polynomial rolling hash updated per word, and occurrences are counted in
// a map reused between calls. Two different runs colliding on a 64-bit
// hash is the only way to report a loop that is not one.
func FindRepetition(s string, n, maxRepeats int) (Repeat, bool) {
	if n <= 0 {
		n = DefaultNGram
	}
	if maxRepeats <= 0 || len(s) == 0 {
		return Repeat{}, false
	}
	w := windowPool.Get().(*window)
	defer windowPool.Put(w)
	w.reset(n)
	var found Repeat
	ok := false
	eachWord(s, func(h uint64, start, end int) bool {
		key, first, full := w.push(h, start)
		if !full {
			return true
		}
		e := w.counts.slot(key)
		if e.count == 0 {
			e.first = uint32(first)
		}
		e.count++
		if int(e.count) > maxRepeats {
			// The run's text ends where its n-th word ends; recompute it
			// from the first occurrence, which has the same words.
			found = Repeat{Words: n, Offset: int(e.first), Count: int(e.count)}
			found.Text = s[e.first:firstRunEnd(s, int(e.first), n)]
			ok = true
			return false
		}
		return true
	})
	return found, ok
}

// hashBase is the multiplier of the rolling n-gram hash (odd, so it is
// invertible mod 2^64 and mixes every bit).
const hashBase = 0x9E3779B97F4A7C15

type entry struct {
	count uint32
	first uint32 // byte offset of the first occurrence
}

// window holds the last n word hashes and start offsets and the n-gram counts.
type window struct {
	n      int
	hashes []uint64
	starts []int
	pos    int    // words pushed
	g      uint64 // rolling hash of the last n words
	powN   uint64 // hashBase^n
	counts table
}

var windowPool = sync.Pool{New: func() any { return &window{} }}

func (w *window) reset(n int) {
	w.n, w.pos, w.g = n, 0, 0
	if cap(w.hashes) < n {
		w.hashes, w.starts = make([]uint64, n), make([]int, n)
	}
	w.hashes, w.starts = w.hashes[:n], w.starts[:n]
	w.powN = 1
	for range n {
		w.powN *= hashBase
	}
	w.counts.reset()
}

// push adds a word and returns the hash of the n-gram ending with it, the
// offset where that n-gram starts, and whether n words have been seen.
func (w *window) push(h uint64, start int) (key uint64, first int, full bool) {
	slot := w.pos % w.n
	w.g = w.g*hashBase + h
	if w.pos >= w.n {
		w.g -= w.hashes[slot] * w.powN
	}
	w.hashes[slot], w.starts[slot] = h, start
	w.pos++
	if w.pos < w.n {
		return 0, 0, false
	}
	// The oldest word of the window is the slot after the newest.
	return mix(w.g), w.starts[w.pos%w.n], true
}

// mix is a 64-bit finalizer, so nearby rolling hashes spread over the map.
func mix(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// firstRunEnd returns the end offset of the n-th word starting at start.
func firstRunEnd(s string, start, n int) int {
	end, k := start, 0
	eachWord(s[start:], func(_ uint64, _, e int) bool {
		end, k = start+e, k+1
		return k < n
	})
	return end
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// eachWord calls fn with the FNV-1a hash and byte range of every word of s
// until fn returns false. A word is a run of non-space characters; each
// CJK character (Han, Hiragana, Katakana, Hangul) is a word by itself, as
// those scripts do not separate words with spaces.
func eachWord(s string, fn func(h uint64, start, end int) bool) {
	i := 0
	for i < len(s) {
		c := s[i]
		if c < utf8.RuneSelf {
			if asciiSpace[c] {
				i++
				continue
			}
		} else {
			r, size := utf8.DecodeRuneInString(s[i:])
			if unicode.IsSpace(r) {
				i += size
				continue
			}
			if isCJK(r) {
				h := uint64(fnvOffset)
				for j := range size {
					h = (h ^ uint64(s[i+j])) * fnvPrime
				}
				if !fn(h, i, i+size) {
					return
				}
				i += size
				continue
			}
		}
		start := i
		h := uint64(fnvOffset)
		for i < len(s) {
			c := s[i]
			if c < utf8.RuneSelf {
				if asciiSpace[c] {
					break
				}
				h = (h ^ uint64(c)) * fnvPrime
				i++
				continue
			}
			r, size := utf8.DecodeRuneInString(s[i:])
			if unicode.IsSpace(r) || isCJK(r) {
				break
			}
			for j := range size {
				h = (h ^ uint64(s[i+j])) * fnvPrime
			}
			i += size
		}
		if !fn(h, start, i) {
			return
		}
	}
}

var asciiSpace = [utf8.RuneSelf]bool{'\t': true, '\n': true, '\v': true, '\f': true, '\r': true, ' ': true}

func isCJK(r rune) bool {
	return unicode.In(r, unicode.Han, unicode.Hiragana, unicode.Katakana, unicode.Hangul)
}

// table counts n-gram hashes with open addressing and linear probing. A Go
// map costs about five times as much per word here; a generation stamp
// empties the table in O(1), so a pooled table is reused without clearing.
type table struct {
	keys []uint64
	vals []entry
	gens []uint32
	gen  uint32
	used int
	mask uint64
}

const minTableSize = 1 << 12

func (t *table) reset() {
	if t.keys == nil {
		t.grow(minTableSize)
		return
	}
	t.gen++
	t.used = 0
	if t.gen == 0 { // wrapped: stale stamps could look current
		clear(t.gens)
		t.gen = 1
	}
}

func (t *table) grow(size int) {
	old := *t
	t.keys, t.vals, t.gens = make([]uint64, size), make([]entry, size), make([]uint32, size)
	t.mask, t.gen, t.used = uint64(size-1), 1, 0
	for i, g := range old.gens {
		if old.keys != nil && g == old.gen {
			*t.slot(old.keys[i]) = old.vals[i]
		}
	}
}

// slot returns the counter of key, adding a zero one if key is new.
func (t *table) slot(key uint64) *entry {
	if 2*(t.used+1) > len(t.keys) {
		t.grow(2 * len(t.keys))
	}
	for i := key & t.mask; ; i = (i + 1) & t.mask {
		if t.gens[i] != t.gen {
			t.gens[i], t.keys[i], t.vals[i] = t.gen, key, entry{}
			t.used++
			return &t.vals[i]
		}
		if t.keys[i] == key {
			return &t.vals[i]
		}
	}
}
