package token

import (
	"github.com/mailroom/tailer/decoder/action"

	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
)

const (
	// KeySize is the size of a signing key in bytes (64 hex characters).
	KeySize = 32
	// SecretSize is the size of a token's secret in bytes.
	SecretSize = 32
	// Len is the length of a token: base64url without padding of the
	// secret followed by the 32-byte MAC.
	Len = 86
	// KeyLen is the length of a token key (AppendKey).
	KeyLen = 22
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

// Signer signs and verifies tokens with one key. It reuses one HMAC state
// and is not safe for concurrent use; give each goroutine its own.
type Signer struct {
	id    string
	mac   hash.Hash
	input []byte
	raw   [SecretSize + sha256.Size]byte
}

// NewSigner returns a Signer for a 32-byte key, named id.
func NewSigner(id string, key []byte) (*Signer, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("signing key is %d bytes, want %d", len(key), KeySize)
	}
	return &Signer{id: id, mac: hmac.New(sha256.New, key)}, nil
}

// ID is the id of the signer's key.
func (s *Signer) ID() string { return s.id }

// signedInput builds the bytes mailroom signs for action: its prefix ‖
// secret ‖ its code (Actions). An action without a code signs none,
// whatever the row's code column holds.
func (s *Signer) signedInput(action action.Action, secret *[SecretSize]byte, code []byte) ([]byte, error) {
	spec, ok := action.Spec()
	switch {
	case !ok:
		return nil, fmt.Errorf("cannot sign action %d", action)
	case spec.CodeLen == 0:
		code = nil
	case len(code) != spec.CodeLen:
		return nil, fmt.Errorf("%s code is %d bytes, want %d", spec.Label, len(code), spec.CodeLen)
	}
	s.input = append(append(append(s.input[:0], spec.Prefix...), secret[:]...), code...)
	return s.input, nil
}

func (s *Signer) sum(input []byte) []byte {
	s.mac.Reset()
	s.mac.Write(input)
	return s.mac.Sum(s.raw[SecretSize:SecretSize])
}

// AppendToken appends the 86-character token for secret (and code, for
// password recovery) to dst.
func (s *Signer) AppendToken(dst []byte, action action.Action, secret *[SecretSize]byte, code []byte) ([]byte, error) {
	input, err := s.signedInput(action, secret, code)
	if err != nil {
		return dst, err
	}
	copy(s.raw[:SecretSize], secret[:])
	s.sum(input)
	return b64.AppendEncode(dst, s.raw[:]), nil
}

// Token returns the token for secret and code as a string.
func (s *Signer) Token(action action.Action, secret *[SecretSize]byte, code []byte) (string, error) {
	var buf [Len]byte
	out, err := s.AppendToken(buf[:0], action, secret, code)
	return string(out), err
}

// ErrInvalidToken is returned for a token that is malformed or whose MAC
// matches no key.
var ErrInvalidToken = errors.New("invalid token")

// decode splits a token into its secret and MAC.
func decode(token string) (raw [SecretSize + sha256.Size]byte, err error) {
	if len(token) != Len {
		return raw, fmt.Errorf("%w: %d characters, want %d", ErrInvalidToken, len(token), Len)
	}
	n, derr := b64.Decode(raw[:], []byte(token))
	if derr != nil || n != len(raw) {
		return raw, fmt.Errorf("%w: not base64url", ErrInvalidToken)
	}
	return raw, nil
}

// KeyOfToken is the token key of a signed token, read from the secret it
// carries, without checking its MAC (false: not a token's form): what a
// reader of a line that holds the token can be checked by.
func KeyOfToken(token string) (RawKey, bool) {
	raw, err := decode(token)
	if err != nil {
		return RawKey{}, false
	}
	return RawKeyOf((*[SecretSize]byte)(raw[:SecretSize])), true
}

// matches reports, in constant time, whether mac is s's for the token's
// input.
func (s *Signer) matches(action action.Action, secret *[SecretSize]byte, code string, mac []byte) (bool, error) {
	input, err := s.signedInput(action, secret, []byte(code))
	if err != nil {
		return false, fmt.Errorf("%w: %v", ErrInvalidToken, err)
	}
	return subtle.ConstantTimeCompare(s.sum(input), mac) == 1, nil
}

// Verify checks token as a token for action (and code, for password
// recovery) signed with s's key, and returns its secret. The MAC is
// compared in constant time.
func (s *Signer) Verify(token string, action action.Action, code string) ([SecretSize]byte, error) {
	var secret [SecretSize]byte
	raw, err := decode(token)
	if err != nil {
		return secret, err
	}
	copy(secret[:], raw[:SecretSize])
	ok, err := s.matches(action, &secret, code, raw[SecretSize:])
	if err != nil {
		return secret, err
	}
	if !ok {
		return secret, fmt.Errorf("%w: signature does not match", ErrInvalidToken)
	}
	return secret, nil
}

// AppendKey appends the token key for a token's 32-byte secret: the first
// 16 bytes of SHA-256(secret), base64url without padding. Secrets are
// UNIQUE in the schema and random, so unlike token ids (which TRUNCATE ...
// RESTART IDENTITY reuses) a key is never reused, and it does not change
// when the signing key rotates.
func AppendKey(dst []byte, secret *[SecretSize]byte) []byte {
	sum := RawKeyOf(secret)
	var out [KeyLen]byte
	b64.Encode(out[:], sum[:])
	return append(dst, out[:]...)
}

// RawKey is a token key's 16 bytes, before base64url: the form a set of
// many token keys keeps them in.
type RawKey [16]byte

// RawKeyOf returns the token key of a token's secret, as bytes.
func RawKeyOf(secret *[SecretSize]byte) RawKey {
	sum := sha256.Sum256(secret[:])
	return RawKey(sum[:16])
}

// ParseRawKey returns the bytes of the token key s (AppendKey's form);
// false when s is not one.
func ParseRawKey(s string) (RawKey, bool) {
	var k RawKey
	if len(s) != KeyLen {
		return k, false
	}
	// Strict: a string AppendKey never writes (other trailing bits) is
	// no key, not another spelling of one.
	n, err := b64.Strict().Decode(k[:], []byte(s))
	return k, err == nil && n == len(k)
}

// KeyOf returns the token key of a token, whose first 32 bytes are the
// secret.
func KeyOf(token string) (string, error) {
	raw, err := decode(token)
	if err != nil {
		return "", errors.New("not an 86-character base64url token")
	}
	return string(AppendKey(nil, (*[SecretSize]byte)(raw[:SecretSize]))), nil
}
