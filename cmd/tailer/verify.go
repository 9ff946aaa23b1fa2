package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/mailroom/tailer/publish/token"
)

func verify(args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	var code string
	var shared, tokens []string
	for i := 0; i < len(args); i++ {
		// A token may start with '-' (base64url): taken as it is, not as
		// a flag.
		if looksLikeToken(args[i]) {
			tokens = append(tokens, args[i])
			continue
		}
		if args[i] == "--code" || args[i] == "-code" {
			if i+1 >= len(args) {
				fmt.Fprintln(stderr, "tailer verify: --code needs the 5-character code")
				return exitConfig
			}
			i++
			code = args[i]
			continue
		}
		shared = append(shared, args[i])
	}
	cfg, rest, exit := loadKeyedConfig("verify [--code CODE] TOKEN", verifyVars, shared, lookupEnv, stderr)
	if cfg == nil {
		return exit
	}
	rest = append(tokens, rest...)
	if len(rest) != 1 {
		fmt.Fprintln(stderr, "tailer verify: give exactly one token (and --code CODE for a password recovery token)")
		return exitConfig
	}
	action := token.Activation
	if code != "" {
		action = token.PasswordRecovery
	}
	id, secret, err := cfg.Keys.Verify(rest[0], action, code)
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
