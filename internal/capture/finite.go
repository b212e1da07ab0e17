package capture

import (
	"encoding/binary"
	"fmt"
)

// format is a float dtype's bit layout, for finding NaN and Inf on the raw
// bits: an element is NaN or Inf exactly when its exponent bits are all
// ones (Inf when its mantissa is zero), so no element is converted.
type format struct {
	name     string
	size     int    // bytes per element
	exponent uint64 // exponent mask of one element
	mantissa uint64 // mantissa mask of one element
	// Per 64-bit word, one lane per element: the exponent mask repeated,
	// each lane's all-but-top bits (added to a lane to carry into its top
	// bit when the lane is not zero) and each lane's top bit.
	expWord, lowWord, topWord uint64
}

var formats = map[string]format{
	"bf16": lanes("bf16", 2, 0x7F80, 0x007F),
	"f16":  lanes("f16", 2, 0x7C00, 0x03FF),
	"f32":  lanes("f32", 4, 0x7F800000, 0x007FFFFF),
}

func lanes(name string, size int, exponent, mantissa uint64) format {
	f := format{name: name, size: size, exponent: exponent, mantissa: mantissa}
	bits := 8 * size
	for shift := 0; shift < 64; shift += bits {
		f.expWord |= exponent << shift
		f.lowWord |= (1<<(bits-1) - 1) << shift
		f.topWord |= 1 << (shift + bits - 1)
	}
	return f
}

// finiteWord reports, per lane, whether an element is finite: a lane of
// (x & exp) ^ exp is zero exactly when the exponent is all ones; its top
// bit is clear (the sign is masked off), so adding the low bits sets the
// top bit exactly when the lane is not zero, with no carry into the next
// lane. All lanes finite gives topWord.
func (f format) finiteWord(x uint64) uint64 {
	return (((x & f.expWord) ^ f.expWord) + f.lowWord) & f.topWord
}

// firstNonFinite returns the index of the first NaN or Inf element of b
// (little-endian elements, len a multiple of f.size), or -1. It tests 32
// bytes per step and looks at single elements only around a hit.
func (f format) firstNonFinite(b []byte) int {
	i := 0
	for ; i+32 <= len(b); i += 32 {
		all := f.finiteWord(binary.LittleEndian.Uint64(b[i:])) &
			f.finiteWord(binary.LittleEndian.Uint64(b[i+8:])) &
			f.finiteWord(binary.LittleEndian.Uint64(b[i+16:])) &
			f.finiteWord(binary.LittleEndian.Uint64(b[i+24:]))
		if all != f.topWord {
			break
		}
	}
	for ; i+f.size <= len(b); i += f.size {
		if f.element(b[i:])&f.exponent == f.exponent {
			return i / f.size
		}
	}
	return -1
}

func (f format) element(b []byte) uint64 {
	if f.size == 2 {
		return uint64(binary.LittleEndian.Uint16(b))
	}
	return uint64(binary.LittleEndian.Uint32(b))
}

// nonFinite names the first NaN/Inf element: its flat index and its
// [token, layer, unit] position.
func nonFinite(path string, f format, b []byte, index int, s Shape) error {
	bits := f.element(b)
	kind, what := KindInf, "Inf"
	if bits&f.mantissa != 0 {
		kind, what = KindNaN, "NaN"
	}
	perToken := max(s.Layers*s.Hidden, 1)
	tok, rest := index/perToken, index%perToken
	return &FileError{Path: path, Kind: kind, Detail: fmt.Sprintf("hidden_states[%d, %d, %d] (element %d) is %s (%s bits 0x%0*x)",
		tok, rest/max(s.Hidden, 1), rest%max(s.Hidden, 1), index, what, f.name, 2*f.size, bits)}
}
