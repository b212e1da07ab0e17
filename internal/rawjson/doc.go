// Package rawjson walks the top level of a JSON text without decoding its
// values: the members of an object and the elements of an array come out
// as raw byte slices of the text, and the whole text is checked on the way
// with the grammar encoding/json.Valid applies.
//
// It exists for request bodies that carry a conversation's whole history:
// decoding one into a map to add a key and encoding it back (encoding/json
// compacts and re-validates every raw value) cost the runner several times
// what sending those bytes costs, on every turn. It does not decode
// strings other than member keys (String and AppendString read and write
// a string value as encoding/json does), and never allocates for values.
//
// The walking, checking, unquoting and quoting are jsontext's
// (github.com/go-json-experiment/json, the Go team's package that became
// encoding/json/jsontext): a Decoder reading the text in place from a
// bytes.Buffer, with duplicate names and invalid UTF-8 allowed as
// encoding/json allows them. This package adds only what encoding/json
// v1 does and jsontext does not: Member.Spaced (whitespace between a
// value's tokens), and AppendString's \u2028, \u2029 and \ufffd escapes.
//
// Measured with dispatch's BenchmarkTurnCost (16k tokens of history on 2
// shared cores): walking instead of decoding took the runner's CPU per
// turn from 2,134 to 1,146 µs, 1k-token turns from 481 to 392 µs. The
// jsontext walk costs no more than the hand-written SWAR scanner it
// replaced, though it checks again the values CheckedObject and
// CheckedArray are given (the scanner only skipped their strings): its
// string scan is twice as fast (BenchmarkObject, 70 KB: 76 -> 34 µs).
// Per turn, medians of 9 interleaved runs each, scanner -> jsontext:
// 16k tokens 1,119 (1,053-1,179) -> 1,059 (1,025-1,188) µs, 4k 606 ->
// 595, 1k 428 -> 396. CheckedObject and CheckedArray split what a walk
// checked without checking it again (checked.go): of the three passes a
// conversation's first turn made over its history (the body, its
// messages, each message), two were checks of checked text.
package rawjson
