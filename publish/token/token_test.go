package token

import (
	"github.com/mailroom/tailer/decoder/action"

	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

type vector struct {
	KeyHex    string  `json:"key_hex"`
	Action    string  `json:"action"`
	SecretHex string  `json:"secret_hex"`
	Code      *string `json:"code"`
	Token     string  `json:"token"`
}

// loadVectors reads the contract's signing vectors. The copy in testdata
// keeps the package testable on its own; when the shared contract is beside
// the repository it must be the same file.
func loadVectors(t *testing.T) []vector {
	t.Helper()
	data, err := os.ReadFile("testdata/signing-vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	if shared, err := os.ReadFile("../../../shared/contract/signing-vectors.json"); err == nil && !bytes.Equal(shared, data) {
		t.Fatal("testdata/signing-vectors.json differs from ../shared/contract/signing-vectors.json; copy the contract again")
	}
	var doc struct{ Vectors []vector }
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Vectors) == 0 {
		t.Fatal("no vectors")
	}
	return doc.Vectors
}

func parseAction(t *testing.T, s string) action.Action {
	t.Helper()
	for _, a := range []action.Action{action.Activation, action.PasswordRecovery} {
		if a.String() == s {
			return a
		}
	}
	t.Fatalf("action %q", s)
	return 0
}

var tokenAlphabet = regexp.MustCompile(`^[A-Za-z0-9_-]{86}$`)

func TestSigningVectors(t *testing.T) {
	for i, v := range loadVectors(t) {
		key, err := ParseKey(v.KeyHex)
		if err != nil {
			t.Fatalf("vector %d: %v", i, err)
		}
		s, err := NewSigner("k", key)
		if err != nil {
			t.Fatal(err)
		}
		action := parseAction(t, v.Action)
		var secret [SecretSize]byte
		if _, err := hex.Decode(secret[:], []byte(v.SecretHex)); err != nil {
			t.Fatal(err)
		}
		var code string
		if v.Code != nil {
			code = *v.Code
		}
		got, err := s.Token(action, &secret, []byte(code))
		if err != nil {
			t.Fatalf("vector %d: %v", i, err)
		}
		if got != v.Token {
			t.Errorf("vector %d (%s, code %q): token %s, want %s", i, v.Action, code, got, v.Token)
		}
		if !tokenAlphabet.MatchString(got) {
			t.Errorf("vector %d: token %q is not 86 base64url characters", i, got)
		}
		back, err := s.Verify(v.Token, action, code)
		if err != nil || back != secret {
			t.Errorf("vector %d: Verify = %x, %v", i, back, err)
		}
		ring, _ := SingleKey(key)
		if id, back, err := ring.Verify(v.Token, action, code); err != nil || back != secret || id != KeyID(key) {
			t.Errorf("vector %d: Ring.Verify = %s, %x, %v", i, id, back, err)
		}
	}
}

func TestVerifyRejects(t *testing.T) {
	v := loadVectors(t)[1] // password_recovery, code 01234
	key, _ := ParseKey(v.KeyHex)
	otherKey, _ := ParseKey(strings.Repeat("ab", 32))
	flipped := []byte(v.Token)
	flipped[50] ^= 'A' ^ 'B'
	for _, tc := range []struct {
		name, token, code string
		key               []byte
		action            action.Action
	}{
		{"wrong code", v.Token, "01235", key, action.PasswordRecovery},
		{"wrong action", v.Token, "", key, action.Activation},
		{"wrong key", v.Token, "01234", otherKey, action.PasswordRecovery},
		{"flipped mac", string(flipped), "01234", key, action.PasswordRecovery},
		{"short", v.Token[:85], "01234", key, action.PasswordRecovery},
		{"not base64url", strings.Repeat("+", 86), "01234", key, action.PasswordRecovery},
		{"short code", v.Token, "0123", key, action.PasswordRecovery},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := NewSigner("k", tc.key)
			if _, err := s.Verify(tc.token, tc.action, tc.code); !errors.Is(err, ErrInvalidToken) {
				t.Fatalf("Verify err = %v, want ErrInvalidToken", err)
			}
		})
	}
	s, _ := NewSigner("k", key)
	if _, err := s.Verify(v.Token, action.PasswordRecovery, "01234"); err != nil {
		t.Fatalf("the unmodified token must verify: %v", err)
	}
}

func TestParseKey(t *testing.T) {
	good := strings.Repeat("cafebabe", 8)
	if k, err := ParseKey(good); err != nil || len(k) != KeySize {
		t.Fatalf("ParseKey(good) = %x, %v", k, err)
	}
	for _, bad := range []string{"", good[:63], good + "0", strings.Repeat("zz", 32)} {
		_, err := ParseKey(bad)
		if err == nil {
			t.Errorf("ParseKey(%q) succeeded", bad)
			continue
		}
		if bad != "" && strings.Contains(err.Error(), bad) {
			t.Errorf("error %q repeats the key", err)
		}
	}
}

func TestSignRejectsUnsignable(t *testing.T) {
	s, _ := NewSigner("k", make([]byte, KeySize))
	var secret [SecretSize]byte
	if _, err := s.AppendToken(nil, action.PasswordRecovery, &secret, []byte("123")); err == nil {
		t.Error("recovery with a 3-byte code signed")
	}
	if _, err := s.AppendToken(nil, 0, &secret, nil); err == nil {
		t.Error("unknown action signed")
	}
}

// The token key is the one consumers have deduplicated on: SHA-256 of the
// secret, its first 16 bytes in base64url, read from any signed token.
func TestKeyOf(t *testing.T) {
	var secret [SecretSize]byte
	for i := range secret {
		secret[i] = byte(i)
	}
	// A signed token is the secret followed by its 32-byte MAC.
	tok := b64.EncodeToString(append(secret[:], make([]byte, 32)...))
	key, err := KeyOf(tok)
	if err != nil {
		t.Fatal(err)
	}
	if want := string(AppendKey(nil, &secret)); key != want || len(key) != KeyLen {
		t.Fatalf("KeyOf = %q, want %q (%d characters)", key, want, KeyLen)
	}
	for _, bad := range []string{"", tok[:85], tok + "A", strings.Replace(tok, tok[:1], "+", 1)} {
		if _, err := KeyOf(bad); err == nil {
			t.Errorf("KeyOf(%q) accepted", bad)
		}
	}
}

// The package is what a backend imports to verify a token: it must not
// pull in the tailer (JetStream, pgx, the join) with it, only the action
// table, itself of the standard library alone.
func TestImportsOnlyTheStandardLibrary(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, out)
	}
	var outside []string
	for _, p := range strings.Fields(string(out)) {
		if p != "github.com/mailroom/tailer/publish/token" && p != "github.com/mailroom/tailer/decoder/action" {
			outside = append(outside, p)
		}
	}
	if len(outside) > 0 {
		t.Fatalf("publish/token imports packages outside the standard library and decoder/action: %v", outside)
	}
}

func BenchmarkAppendToken(b *testing.B) {
	s, _ := NewSigner("k", make([]byte, KeySize))
	var secret [SecretSize]byte
	buf := make([]byte, 0, Len)
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = s.AppendToken(buf[:0], action.PasswordRecovery, &secret, []byte("01234"))
	}
}

// A token key's bytes (what a window of a million keys keeps) are the key
// AppendKey writes, read back; anything else is no key.
func TestRawKey(t *testing.T) {
	var secret [SecretSize]byte
	for i := range secret {
		secret[i] = byte(3 * i)
	}
	key := string(AppendKey(nil, &secret))
	raw, ok := ParseRawKey(key)
	if !ok || raw != RawKeyOf(&secret) {
		t.Fatalf("ParseRawKey(%q) = %x, %v; want %x", key, raw, ok, RawKeyOf(&secret))
	}
	for _, bad := range []string{"", key[:21], key + "A", strings.Replace(key, key[:1], "+", 1), key[:21] + "="} {
		if _, ok := ParseRawKey(bad); ok {
			t.Errorf("ParseRawKey(%q) accepted", bad)
		}
	}
}

func FuzzParseRawKey(f *testing.F) {
	var secret [SecretSize]byte
	f.Add(string(AppendKey(nil, &secret)))
	f.Add("")
	f.Add("AAAAAAAAAAAAAAAAAAAAAB")
	f.Fuzz(func(t *testing.T, s string) {
		raw, ok := ParseRawKey(s)
		if ok && b64.EncodeToString(raw[:]) != s {
			t.Fatalf("ParseRawKey(%q) = %x, which encodes as %q", s, raw, b64.EncodeToString(raw[:]))
		}
	})
}
