package natsconn

import (
	"fmt"

	"golang.org/x/crypto/bcrypt"
)

// PasswordCost is the bcrypt cost of a NATS user's password hash: the
// NATS CLI's (nats server passwd), which the stack used before.
const PasswordCost = 11

// MinPassword is the shortest password HashPassword takes, as the NATS
// CLI: a server that holds only a hash is still as strong as the
// password.
const MinPassword = 10

// HashPassword is pw's bcrypt hash, which a NATS server's configuration
// takes in place of the password (the compose stack's nats-auth). The
// error never holds pw.
func HashPassword(pw string) (string, error) {
	if len(pw) < MinPassword {
		return "", fmt.Errorf("the password is %d characters: a NATS user's password here is %d or more", len(pw), MinPassword)
	}
	h, err := bcrypt.GenerateFromPassword([]byte(pw), PasswordCost)
	if err != nil {
		return "", fmt.Errorf("bcrypt of a %d-character password: %w", len(pw), err)
	}
	return string(h), nil
}
