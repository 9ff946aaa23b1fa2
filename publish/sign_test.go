package publish

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/mailroom/tailer/decoder"
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
	if shared, err := os.ReadFile("../../shared/contract/signing-vectors.json"); err == nil && !bytes.Equal(shared, data) {
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

var tokenAlphabet = regexp.MustCompile(`^[A-Za-z0-9_-]{86}$`)

func TestSigningVectors(t *testing.T) {
	for i, v := range loadVectors(t) {
		key, err := ParseKey(v.KeyHex)
		if err != nil {
			t.Fatalf("vector %d: %v", i, err)
		}
		s, err := NewSigner(key)
		if err != nil {
			t.Fatal(err)
		}
		action, err := decoder.ParseAction(v.Action)
		if err != nil {
			t.Fatal(err)
		}
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
		back, err := Verify(v.KeyHex, v.Token, action, code)
		if err != nil || back != secret {
			t.Errorf("vector %d: Verify = %x, %v", i, back, err)
		}
	}
}

func TestVerifyRejects(t *testing.T) {
	v := loadVectors(t)[1] // password_recovery, code 01234
	key, _ := ParseKey(v.KeyHex)
	s, _ := NewSigner(key)
	otherKey := strings.Repeat("ab", 32)
	flipped := []byte(v.Token)
	flipped[50] ^= 'A' ^ 'B'
	for _, tc := range []struct {
		name, key, token, code string
		action                 decoder.Action
	}{
		{"wrong code", v.KeyHex, v.Token, "01235", decoder.ActionPasswordRecovery},
		{"wrong action", v.KeyHex, v.Token, "", decoder.ActionActivation},
		{"wrong key", otherKey, v.Token, "01234", decoder.ActionPasswordRecovery},
		{"flipped mac", v.KeyHex, string(flipped), "01234", decoder.ActionPasswordRecovery},
		{"short", v.KeyHex, v.Token[:85], "01234", decoder.ActionPasswordRecovery},
		{"not base64url", v.KeyHex, strings.Repeat("+", 86), "01234", decoder.ActionPasswordRecovery},
		{"short code", v.KeyHex, v.Token, "0123", decoder.ActionPasswordRecovery},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Verify(tc.key, tc.token, tc.action, tc.code); !errors.Is(err, ErrInvalidToken) {
				t.Fatalf("Verify err = %v, want ErrInvalidToken", err)
			}
		})
	}
	if _, err := s.Verify(v.Token, decoder.ActionPasswordRecovery, "01234"); err != nil {
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
	s, _ := NewSigner(make([]byte, KeySize))
	var secret [SecretSize]byte
	if _, err := s.AppendToken(nil, decoder.ActionPasswordRecovery, &secret, []byte("123")); err == nil {
		t.Error("recovery with a 3-byte code signed")
	}
	if _, err := s.AppendToken(nil, decoder.ActionUnknown, &secret, nil); err == nil {
		t.Error("unknown action signed")
	}
}

func BenchmarkAppendToken(b *testing.B) {
	s, _ := NewSigner(make([]byte, KeySize))
	var secret [SecretSize]byte
	buf := make([]byte, 0, TokenLen)
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = s.AppendToken(buf[:0], decoder.ActionPasswordRecovery, &secret, []byte("01234"))
	}
}
