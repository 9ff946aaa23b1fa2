package token

import (
	"github.com/mailroom/tailer/decoder/action"

	"crypto/rand"
	"encoding/hex"
	"errors"
	"os/exec"
	"testing"
)

// A verifier in another language, written from docs/tokens.md alone
// (testdata/verify.pl: Perl, which Debian's PostgreSQL packages bring),
// accepts every contract vector and tokens this package signs with a
// fresh key, and rejects a token tampered with, another action's, and a
// recovery token with another code.
func TestVerifierFromTheDocs(t *testing.T) {
	perl, err := exec.LookPath("perl")
	if err != nil {
		t.Fatal("perl is needed (Debian's postgresql-common depends on it): ", err)
	}
	verify := func(keyHex, action, tok, code string) int {
		t.Helper()
		err := exec.Command(perl, "testdata/verify.pl", keyHex, action, tok, code).Run()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return 0
		case errors.As(err, &ee):
			return ee.ExitCode()
		}
		t.Fatal(err)
		return -1
	}
	for i, v := range loadVectors(t) {
		code := ""
		if v.Code != nil {
			code = *v.Code
		}
		if got := verify(v.KeyHex, v.Action, v.Token, code); got != 0 {
			t.Errorf("vector %d (%s): exit %d, want 0", i, v.Action, got)
		}
	}
	key := make([]byte, 32)
	rand.Read(key)
	s, err := NewSigner("k", key)
	if err != nil {
		t.Fatal(err)
	}
	var secret [SecretSize]byte
	rand.Read(secret[:])
	keyHex := hex.EncodeToString(key)
	act, err := s.Token(action.Activation, &secret, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := s.Token(action.PasswordRecovery, &secret, []byte("35866"))
	if err != nil {
		t.Fatal(err)
	}
	tampered := []byte(act)
	// A MAC character changed for another of the alphabet.
	if tampered[60] = 'A'; act[60] == 'A' {
		tampered[60] = 'B'
	}
	for _, tc := range []struct {
		name, action, tok, code string
		want                    int
	}{
		{"activation", "activation", act, "", 0},
		{"password recovery", "password_recovery", rec, "35866", 0},
		{"tampered", "activation", string(tampered), "", 1},
		{"another action's", "password_recovery", act, "35866", 1},
		{"another code", "password_recovery", rec, "35867", 1},
	} {
		if got := verify(keyHex, tc.action, tc.tok, tc.code); got != tc.want {
			t.Errorf("%s: exit %d, want %d", tc.name, got, tc.want)
		}
	}
}
