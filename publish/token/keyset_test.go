package token

import "testing"

// A KeySet holds each key added once, whatever the order, also keys added
// after it was searched; a string that is no key is not added.
func TestKeySet(t *testing.T) {
	secret := func(b byte) *[SecretSize]byte { var s [SecretSize]byte; s[0] = b; return &s }
	key := func(b byte) string { return string(AppendKey(nil, secret(b))) }
	var s KeySet
	for _, b := range []byte{5, 1, 5, 3} {
		if !s.Add(key(b)) {
			t.Fatalf("key %d not added", b)
		}
	}
	if s.Add("not-a-key") || s.Add(key(9)[:21]) {
		t.Fatal("a string that is no key added")
	}
	if n := s.Len(); n != 3 {
		t.Fatalf("Len = %d, want 3", n)
	}
	if !s.Has(RawKeyOf(secret(3))) || s.Has(RawKeyOf(secret(2))) {
		t.Fatal("Has wrong before the set grew")
	}
	s.Add(key(2))
	if !s.Has(RawKeyOf(secret(2))) || !s.Has(RawKeyOf(secret(5))) || s.Len() != 4 {
		t.Fatalf("after adding 2: Len %d", s.Len())
	}
}
