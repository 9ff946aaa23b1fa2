package token_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/mailroom/tailer/decoder/action"
	"github.com/mailroom/tailer/publish/token"
)

// A backend verifies a token from a link with the tailer's keyring, no
// database call (docs/tokens.md, "Verifying tokens in Go, or from a shell").
func Example_verify() {
	keyringFile := []byte("k1 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 primary\n")
	ring, err := token.ParseRing(keyringFile) // or token.SingleKey(key)
	if err != nil {
		log.Fatal(err)
	}
	// A token as the tailer signs it for the mail, with its code.
	var secret [token.SecretSize]byte
	secret[0] = 7
	tok, err := ring.Signer().Token(action.PasswordRecovery, &secret, []byte("35866"))
	if err != nil {
		log.Fatal(err)
	}

	keyID, got, err := ring.Verify(tok, action.PasswordRecovery, "35866")
	fmt.Println(keyID, got == secret, err)
	// err wraps token.ErrInvalidToken when no key of the ring signed it.
	_, _, err = ring.Verify(tok, action.PasswordRecovery, "35867")
	fmt.Println(errors.Is(err, token.ErrInvalidToken))
	// Output:
	// k1 true <nil>
	// true
}
