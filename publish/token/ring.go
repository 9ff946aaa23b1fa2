package token

import (
	"github.com/mailroom/tailer/decoder/action"

	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Ring is a keyring: one primary key signs every new token, and every key
// of the ring verifies. Keys are rotated in three configuration changes,
// each taking effect at a restart: add the new key (verify only), make it
// primary (the old one stays to verify the tokens mailed before), and
// retire the old one once the longest token lifetime has passed.
//
// A Ring is safe for concurrent use; the Signers it makes are not.
type Ring struct {
	keys    []ringKey
	primary int
}

type ringKey struct {
	id  string
	key []byte
}

// ParseRing reads a keyring file: one key a line, its id, then its 64 hex
// characters, then, on exactly one line, the word primary. Blank lines and
// lines starting with # are ignored:
//
//	# mailroom signing keys
//	2026-05  9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//	2026-11  60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752  primary
//
// An id is 1 to 64 letters, digits, '.', '_' or '-'. Errors name the line
// and never show a key.
func ParseRing(data []byte) (*Ring, error) {
	r := &Ring{primary: -1}
	sc := bufio.NewScanner(bytes.NewReader(data))
	seen := map[string]bool{}
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 || len(f) > 3 || (len(f) == 3 && f[2] != "primary") {
			return nil, fmt.Errorf("line %d: want an id, a key and, on one line, the word primary (%d fields)", n, len(f))
		}
		if err := checkID(f[0]); err != nil {
			return nil, fmt.Errorf("line %d: key id: %w", n, err)
		}
		if seen[f[0]] {
			return nil, fmt.Errorf("line %d: key id %q is given twice", n, f[0])
		}
		seen[f[0]] = true
		key, err := ParseKey(f[1])
		if err != nil {
			return nil, fmt.Errorf("line %d: key %s: %w", n, f[0], err)
		}
		for _, k := range r.keys {
			if bytes.Equal(k.key, key) {
				return nil, fmt.Errorf("line %d: key %s is key %s again", n, f[0], k.id)
			}
		}
		if len(f) == 3 {
			if r.primary >= 0 {
				return nil, fmt.Errorf("line %d: key %s is primary, and so is key %s: one key signs", n, f[0], r.keys[r.primary].id)
			}
			r.primary = len(r.keys)
		}
		r.keys = append(r.keys, ringKey{id: f[0], key: key})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	switch {
	case len(r.keys) == 0:
		return nil, errors.New("holds no key")
	case r.primary < 0:
		return nil, errors.New("names no primary key: write primary after the key that signs")
	}
	return r, nil
}

// checkID refuses an id that could not go into a message header or a
// line of the keyring file as it is.
func checkID(id string) error {
	if len(id) == 0 || len(id) > 64 {
		return fmt.Errorf("%d characters, want 1 to 64", len(id))
	}
	for _, c := range []byte(id) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return errors.New("want letters, digits, '.', '_' or '-'")
		}
	}
	return nil
}

// SingleKey is a ring of one key, which signs: the tailer's
// MAILROOM_SECRET_KEY. Its id is derived from the key (KeyID).
func SingleKey(key []byte) (*Ring, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("signing key is %d bytes, want %d", len(key), KeySize)
	}
	return &Ring{keys: []ringKey{{id: KeyID(key), key: key}}}, nil
}

// KeyID names a key without giving it away: "k-" and the first 12 hex
// digits of a SHA-256 of it.
func KeyID(key []byte) string {
	sum := sha256.Sum256(append([]byte("mailroom key id\x00"), key...))
	return "k-" + hex.EncodeToString(sum[:6])
}

// PrimaryID is the id of the key that signs.
func (r *Ring) PrimaryID() string { return r.keys[r.primary].id }

// IDs are the ids of the ring's keys, in the file's order.
func (r *Ring) IDs() []string {
	ids := make([]string, len(r.keys))
	for i, k := range r.keys {
		ids[i] = k.id
	}
	return ids
}

// Signer returns a Signer of the primary key.
func (r *Ring) Signer() *Signer {
	s, _ := NewSigner(r.keys[r.primary].id, r.keys[r.primary].key)
	return s
}

// Verify checks token as a token for action (and code, for password
// recovery) signed with any key of the ring, and returns the id of the key
// that signed it and its secret. Every key is tried, each compared in
// constant time, so the time taken says nothing about which matched.
func (r *Ring) Verify(token string, action action.Action, code string) (id string, secret [SecretSize]byte, err error) {
	raw, err := decode(token)
	if err != nil {
		return "", secret, err
	}
	copy(secret[:], raw[:SecretSize])
	for _, k := range r.keys {
		s, _ := NewSigner(k.id, k.key)
		ok, err := s.matches(action, &secret, code, raw[SecretSize:])
		if err != nil {
			return "", secret, err
		}
		if ok && id == "" {
			id = k.id
		}
	}
	if id == "" {
		if code != "" {
			// The code is signed with the secret: a wrong code and a wrong
			// key look alike.
			return "", secret, fmt.Errorf("%w: signed with no key of the ring (%s) together with code %q: the code, or the key, is not the one it was issued with", ErrInvalidToken, strings.Join(r.IDs(), ", "), code)
		}
		return "", secret, fmt.Errorf("%w: signed with no key of the ring (%s) as a %s token", ErrInvalidToken, strings.Join(r.IDs(), ", "), action)
	}
	return id, secret, nil
}
