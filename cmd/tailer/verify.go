package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/decoder/action"
	"github.com/mailroom/tailer/publish/token"
)

func (x *cli) verifyCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "verify [--code CODE] [--action ACTION] TOKEN",
		Short: "check a token with the signing key",
		Long: `Check a token's signature with the signing key (or the keyring) and print
the secret it carries: exit 0 when it is valid, 1 when it is not.
A token of an action that signs a code (` + strings.Join(codedLabels(), ", ") + `)
is checked with it: give it with --code.`,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("give exactly one token (and --code CODE for a token signed with its code), got %d arguments", len(args))
			}
			return nil
		},
	}
	code := c.Flags().String("code", "", "the code the token was mailed with, for an action that signs one")
	action := c.Flags().String("action", "", "the token's `action`, "+strings.Join(action.Labels(), " or ")+"; by default the first whose code --code fits")
	load := x.settings(c, verifyVars, true)
	return x.leaf(c, func(_ *cobra.Command, args []string) int {
		cfg, err := load()
		if err != nil {
			return exitConfig
		}
		a, err := verifyAction(*action, *code)
		if err != nil {
			fmt.Fprintf(x.stderr, "tailer verify: --action: %v\n", err)
			return exitConfig
		}
		return verify(cfg, args[0], a, *code, x.stdout)
	})
}

// verifyAction is the action named, or the first whose code rule code
// fits (action.Actions): without a code, one that signs none.
func verifyAction(label, code string) (action.Action, error) {
	if label != "" {
		return action.Parse(label)
	}
	coded := action.Action(0)
	for i, spec := range action.Actions {
		a := action.Action(i + 1)
		if spec.CodeLen == len(code) {
			return a, nil
		}
		if spec.CodeLen > 0 && coded == 0 {
			coded = a
		}
	}
	// A code of no action's length: checked against the first that signs
	// one, which says the length it wants.
	return coded, nil
}

// uncodedFit is the label of the first action that signs no code for
// which tok is valid ("": none).
func uncodedFit(cfg *config.Config, tok string) string {
	for i, spec := range action.Actions {
		if spec.CodeLen > 0 {
			continue
		}
		if _, _, err := cfg.Keys.Verify(tok, action.Action(i+1), ""); err == nil {
			return spec.Label
		}
	}
	return ""
}

// codedLabels are the labels of the actions that sign a code.
func codedLabels() []string {
	var out []string
	for _, spec := range action.Actions {
		if spec.CodeLen > 0 {
			out = append(out, spec.Label)
		}
	}
	return out
}

// verify checks tok as a token of action, signed with code when action
// signs one.
func verify(cfg *config.Config, tok string, action action.Action, code string, stdout io.Writer) int {
	id, secret, err := cfg.Keys.Verify(tok, action, code)
	if err != nil {
		hint := ""
		switch {
		case code == "" && errors.Is(err, token.ErrInvalidToken):
			hint = fmt.Sprintf(" (a %s token is signed with its code: give it with --code CODE)", strings.Join(codedLabels(), " or "))
		case code != "":
			if label := uncodedFit(cfg, tok); label != "" {
				hint = fmt.Sprintf(" (it is a valid %s token, which is signed without a code: drop --code)", label)
			}
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
