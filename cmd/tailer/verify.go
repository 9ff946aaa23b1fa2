package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/publish/token"
)

func (x *cli) verifyCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "verify [--code CODE] TOKEN",
		Short: "check a token with the signing key",
		Long: `Check a token's signature with the signing key (or the keyring) and print
the secret it carries: exit 0 when it is valid, 1 when it is not. A
password recovery token is signed with its code: give it with --code.`,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("give exactly one token (and --code CODE for a password recovery token), got %d arguments", len(args))
			}
			return nil
		},
	}
	code := c.Flags().String("code", "", "the 5-character code a password recovery token was mailed with")
	load := x.settings(c, verifyVars, true)
	return x.leaf(c, func(_ *cobra.Command, args []string) int {
		cfg, err := load()
		if err != nil {
			return exitConfig
		}
		return verify(cfg, args[0], *code, x.stdout)
	})
}

// verify checks tok, signed with code when it is a password recovery
// token's.
func verify(cfg *config.Config, tok, code string, stdout io.Writer) int {
	action := token.Activation
	if code != "" {
		action = token.PasswordRecovery
	}
	id, secret, err := cfg.Keys.Verify(tok, action, code)
	if err != nil {
		hint := ""
		if code == "" && errors.Is(err, token.ErrInvalidToken) {
			hint = " (a password recovery token is signed with its code: give it with --code CODE)"
		}
		fmt.Fprintf(stdout, "invalid %s token: %v%s\n", action, err, hint)
		return exitFailure
	}
	fmt.Fprintf(stdout, "valid %s token, signed with key %s; secret %x\n", action, id, secret)
	return exitOK
}

// looksLikeToken reports whether arg has a token's length and alphabet
// (base64url): no flag does.
func looksLikeToken(arg string) bool {
	if len(arg) != token.Len {
		return false
	}
	for _, c := range []byte(arg) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
