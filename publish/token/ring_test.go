package token

import (
	"github.com/mailroom/tailer/decoder/action"

	"errors"
	"strings"
	"testing"
)

const (
	keyA = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	keyB = "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752"
)

func TestParseRing(t *testing.T) {
	r, err := ParseRing([]byte("# keys\n\n2026-05  " + keyA + "\n2026-11\t" + keyB + "  primary\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r.PrimaryID() != "2026-11" || strings.Join(r.IDs(), ",") != "2026-05,2026-11" || r.Signer().ID() != "2026-11" {
		t.Fatalf("primary %s, ids %v", r.PrimaryID(), r.IDs())
	}
	for _, tc := range []struct{ name, file, want string }{
		{"empty", "# nothing\n", "holds no key"},
		{"no primary", "a " + keyA + "\n", "names no primary key"},
		{"two primaries", "a " + keyA + " primary\nb " + keyB + " primary\n", "line 2: key b is primary, and so is key a"},
		{"a short key", "a " + keyA[:60] + " primary\n", "line 1: key a: must be exactly 64 hex characters, got 60"},
		{"not hex", "a " + strings.Repeat("zz", 32) + " primary\n", "line 1: key a: must contain only hex"},
		{"an id twice", "a " + keyA + " primary\na " + keyB + "\n", `line 2: key id "a" is given twice`},
		{"a key twice", "a " + keyA + " primary\nb " + keyA + "\n", "line 2: key b is key a again"},
		{"a bad id", "a:b " + keyA + " primary\n", "line 1: key id: want letters"},
		{"a fourth field", "a " + keyA + " primary extra\n", "line 1: want an id, a key"},
		{"a word other than primary", "a " + keyA + " verify\n", "line 1: want an id, a key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseRing([]byte(tc.file))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ParseRing = %v, want %q", err, tc.want)
			}
			for _, k := range []string{keyA, keyB, keyA[:60]} {
				if strings.Contains(err.Error(), k) {
					t.Fatalf("the error shows a key: %v", err)
				}
			}
		})
	}
}

// A token verifies against any key of the ring, which names the key that
// signed it; once that key is retired it does not.
func TestRingVerify(t *testing.T) {
	a, _ := ParseKey(keyA)
	sa, _ := NewSigner("a", a)
	var secret [SecretSize]byte
	secret[3] = 9
	tok, _ := sa.Token(action.PasswordRecovery, &secret, []byte("12345"))
	both, _ := ParseRing([]byte("b " + keyB + " primary\na " + keyA + "\n"))
	id, back, err := both.Verify(tok, action.PasswordRecovery, "12345")
	if err != nil || id != "a" || back != secret {
		t.Fatalf("Verify = %s, %x, %v; want key a", id, back, err)
	}
	if _, _, err := both.Verify(tok, action.PasswordRecovery, "12346"); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("another code: %v", err)
	}
	retired, _ := ParseRing([]byte("b " + keyB + " primary\n"))
	if _, _, err := retired.Verify(tok, action.PasswordRecovery, "12345"); !errors.Is(err, ErrInvalidToken) || !strings.Contains(err.Error(), "no key of the ring (b)") {
		t.Fatalf("a retired key's token: %v", err)
	}
}

func TestKeyID(t *testing.T) {
	a, _ := ParseKey(keyA)
	b, _ := ParseKey(keyB)
	if KeyID(a) != KeyID(a) || KeyID(a) == KeyID(b) || !strings.HasPrefix(KeyID(a), "k-") || len(KeyID(a)) != 14 || strings.Contains(keyA, KeyID(a)[2:]) {
		t.Fatalf("KeyID(a) = %s, KeyID(b) = %s", KeyID(a), KeyID(b))
	}
	r, err := SingleKey(a)
	if err != nil || r.PrimaryID() != KeyID(a) {
		t.Fatalf("SingleKey = %v, %v", r, err)
	}
}

// FuzzParseRing: any file is a ring or one error naming what is wrong,
// never showing a key it holds, and a ring always has one primary.
func FuzzParseRing(f *testing.F) {
	f.Add("a " + keyA + " primary\n")
	f.Add("# c\nb " + keyB + "\na " + keyA + " primary\n")
	f.Add("a " + keyA + " primary\na " + keyB + "\n")
	f.Add("\xff " + keyA + " primary")
	f.Fuzz(func(t *testing.T, file string) {
		r, err := ParseRing([]byte(file))
		if err != nil {
			for _, k := range []string{keyA, keyB} {
				if strings.Contains(file, k) && strings.Contains(err.Error(), k) {
					t.Fatalf("the error shows a key: %v", err)
				}
			}
			return
		}
		if r.Signer() == nil || r.PrimaryID() == "" || len(r.IDs()) == 0 {
			t.Fatalf("a ring without a primary: %v", r.IDs())
		}
	})
}
