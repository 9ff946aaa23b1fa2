package token

import (
	"bytes"
	"slices"
)

// KeySet is a set of token keys, 16 bytes each, kept sorted: what a reader
// of the stream keeps of the tokens on it (a resume's window, a resync's
// read-back). A map of the keys' base64 strings took about five times the
// memory (issue 47: BenchmarkWindowMemory in package publish). Not safe
// for concurrent use: Has and Len sort what Add added.
type KeySet struct {
	keys   []RawKey
	sorted int // keys[:sorted] are sorted and each once
}

// Add adds the key k (AppendKey's form), reporting false, and adding
// nothing, when k is not one: a string that is no key matches no token.
func (s *KeySet) Add(k string) bool {
	raw, ok := ParseRawKey(k)
	if ok {
		s.keys = append(s.keys, raw)
	}
	return ok
}

// Has reports whether the set holds k.
func (s *KeySet) Has(k RawKey) bool {
	s.sort()
	_, ok := slices.BinarySearchFunc(s.keys, k, compareRawKeys)
	return ok
}

// Len is the number of keys in the set.
func (s *KeySet) Len() int {
	s.sort()
	return len(s.keys)
}

// sort readies keys for Has, in a slice no larger than they need.
func (s *KeySet) sort() {
	if s.sorted == len(s.keys) {
		return
	}
	slices.SortFunc(s.keys, compareRawKeys)
	s.keys = slices.Compact(s.keys)
	if cap(s.keys) > len(s.keys)+len(s.keys)/8 {
		s.keys = append([]RawKey(nil), s.keys...)
	}
	s.sorted = len(s.keys)
}

func compareRawKeys(a, b RawKey) int { return bytes.Compare(a[:], b[:]) }
