// Package publish signs tokens, encodes batches in the mailroom formats and
// sends them to NATS JetStream. Its Pipeline takes cut batches (package
// batch), has their tokens joined (package batch/join, through the Joiner
// it is given), then signs, encodes and publishes them in order. The
// message format itself, which consumers read too, is package wire's.
package publish

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"

	"github.com/mailroom/tailer/decoder"
)

const (
	// KeySize is the size of the HMAC key in bytes (64 hex characters).
	KeySize = 32
	// SecretSize is the size of a token's secret in bytes.
	SecretSize = 32
	// TokenLen is the length of a signed token: base64url without padding
	// of the secret followed by the 32-byte MAC.
	TokenLen = 86
	// CodeLen is the length of the code signed into password recovery
	// tokens.
	CodeLen = 5
)

var b64 = base64.RawURLEncoding

// ParseKey decodes a signing key given as exactly 64 hex characters. The
// error never repeats the input, so that a mistyped key does not end up in
// logs.
func ParseKey(s string) ([]byte, error) {
	if len(s) != 2*KeySize {
		return nil, fmt.Errorf("must be exactly %d hex characters, got %d", 2*KeySize, len(s))
	}
	key, err := hex.DecodeString(s)
	if err != nil {
		return nil, errors.New("must contain only hex characters (0-9, a-f)")
	}
	return key, nil
}

// Signer produces mailroom tokens. It reuses one HMAC state and is not safe
// for concurrent use; give each goroutine its own.
type Signer struct {
	mac   hash.Hash
	input [len("/activate") + SecretSize + CodeLen]byte
	raw   [SecretSize + sha256.Size]byte
}

// NewSigner returns a Signer for a 32-byte key.
func NewSigner(key []byte) (*Signer, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("signing key is %d bytes, want %d", len(key), KeySize)
	}
	return &Signer{mac: hmac.New(sha256.New, key)}, nil
}

// signedInput builds the bytes mailroom signs: "/activate" ‖ secret, or
// "/recover" ‖ secret ‖ code.
func (s *Signer) signedInput(action decoder.Action, secret *[SecretSize]byte, code []byte) ([]byte, error) {
	switch action {
	case decoder.ActionActivation:
		n := copy(s.input[:], "/activate")
		n += copy(s.input[n:], secret[:])
		return s.input[:n], nil
	case decoder.ActionPasswordRecovery:
		if len(code) != CodeLen {
			return nil, fmt.Errorf("password_recovery code is %d bytes, want %d", len(code), CodeLen)
		}
		n := copy(s.input[:], "/recover")
		n += copy(s.input[n:], secret[:])
		n += copy(s.input[n:], code)
		return s.input[:n], nil
	}
	return nil, fmt.Errorf("cannot sign action %d", action)
}

func (s *Signer) sum(input []byte) []byte {
	s.mac.Reset()
	s.mac.Write(input)
	return s.mac.Sum(s.raw[SecretSize:SecretSize])
}

// AppendToken appends the 86-character token for secret (and code, for
// password recovery) to dst.
func (s *Signer) AppendToken(dst []byte, action decoder.Action, secret *[SecretSize]byte, code []byte) ([]byte, error) {
	input, err := s.signedInput(action, secret, code)
	if err != nil {
		return dst, err
	}
	copy(s.raw[:SecretSize], secret[:])
	s.sum(input)
	return b64.AppendEncode(dst, s.raw[:]), nil
}

// Token returns the token for secret and code as a string.
func (s *Signer) Token(action decoder.Action, secret *[SecretSize]byte, code []byte) (string, error) {
	var buf [TokenLen]byte
	out, err := s.AppendToken(buf[:0], action, secret, code)
	return string(out), err
}

// ErrInvalidToken is returned by Verify for a token that is malformed or
// whose MAC does not match.
var ErrInvalidToken = errors.New("invalid token")

// Verify checks token as a token for action (and code, for password
// recovery) and returns its secret. The MAC is compared in constant time.
func (s *Signer) Verify(token string, action decoder.Action, code string) ([SecretSize]byte, error) {
	var secret [SecretSize]byte
	if len(token) != TokenLen {
		return secret, fmt.Errorf("%w: %d characters, want %d", ErrInvalidToken, len(token), TokenLen)
	}
	var raw [SecretSize + sha256.Size]byte
	n, err := b64.Decode(raw[:], []byte(token))
	if err != nil || n != len(raw) {
		return secret, fmt.Errorf("%w: not base64url", ErrInvalidToken)
	}
	copy(secret[:], raw[:SecretSize])
	input, err := s.signedInput(action, &secret, []byte(code))
	if err != nil {
		return secret, fmt.Errorf("%w: %v", ErrInvalidToken, err)
	}
	if subtle.ConstantTimeCompare(s.sum(input), raw[SecretSize:]) != 1 {
		return secret, fmt.Errorf("%w: signature does not match", ErrInvalidToken)
	}
	return secret, nil
}

// Verify checks a token with a key given as 64 hex characters; see
// Signer.Verify.
func Verify(keyHex, token string, action decoder.Action, code string) ([SecretSize]byte, error) {
	key, err := ParseKey(keyHex)
	if err != nil {
		return [SecretSize]byte{}, fmt.Errorf("signing key: %w", err)
	}
	s, err := NewSigner(key)
	if err != nil {
		return [SecretSize]byte{}, err
	}
	return s.Verify(token, action, code)
}
