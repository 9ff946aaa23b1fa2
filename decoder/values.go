package decoder

// Reading pgoutput's bytes: a tuple of the tokens table into a Token (its
// columns by the relation's map, in text or binary format), and the
// message reader the protocol's fields are taken with.

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/mailroom/tailer/decoder/action"
)

// decodeTuple fills tok from a TupleData. It returns a row error for values
// that cannot form a token and a protocol error when the tuple itself is
// malformed.
func (rel *relation) decodeTuple(r *reader, tok *Token) (rowErr, err error) {
	n := int(r.u16())
	if r.err != nil {
		return nil, r.fail("tuple")
	}
	var seen [5]bool // id, action, secret, code, account
	for i := 0; i < n; i++ {
		kind := r.u8()
		var val []byte
		switch kind {
		case 'n', 'u':
		case 't', 'b':
			val = r.bytes(int(r.u32()))
		default:
			if r.err == nil {
				return nil, fmt.Errorf("%w: tuple column %d: kind %q", ErrProtocol, i, kind)
			}
		}
		if r.err != nil {
			return nil, r.fail("tuple")
		}
		if rowErr != nil {
			continue
		}
		binaryFmt := kind == 'b'
		null := kind != 't' && kind != 'b'
		switch i {
		case rel.colID:
			seen[0] = true
			tok.ID, rowErr = intValue("id", val, null, binaryFmt)
		case rel.colAction:
			seen[1] = true
			if null {
				rowErr = errors.New("action is NULL")
			} else if a, ok := action.Of(val); ok {
				tok.Action = a
			} else {
				// No row to skip: every token of the action would be.
				return nil, &ActionError{Label: string(val)}
			}
		case rel.colSecret:
			seen[2] = true
			rowErr = secretValue(&tok.Secret, val, null, binaryFmt)
		case rel.colCode:
			seen[3] = true
			if null {
				tok.CodeNull = true
			} else if len(val) > len(tok.Code) {
				rowErr = fmt.Errorf("code is %d bytes, want at most %d", len(val), len(tok.Code))
			} else {
				tok.CodeLen = uint8(copy(tok.Code[:], val))
			}
		case rel.colAccount:
			seen[4] = true
			tok.Account, rowErr = intValue("account", val, null, binaryFmt)
		}
	}
	if rowErr != nil {
		return withID(rowErr, seen[0], tok.ID), nil
	}
	for i, name := range [...]string{"id", "action", "secret", "code", "account"} {
		if !seen[i] {
			return fmt.Errorf("column %s missing from the tokens relation", name), nil
		}
	}
	if spec, _ := tok.Action.Spec(); spec.CodeLen > 0 && (tok.CodeNull || int(tok.CodeLen) != spec.CodeLen) {
		if tok.CodeNull {
			return withID(fmt.Errorf("%s token has a NULL code", spec.Label), true, tok.ID), nil
		}
		return withID(fmt.Errorf("%s token code is %d bytes, want %d", spec.Label, tok.CodeLen, spec.CodeLen), true, tok.ID), nil
	}
	return nil, nil
}

// withID names the token of a row error by its id, when the id was
// decoded: the operator finds the row by it (a log line that named only
// its WAL position sent them to pg_waldump). It is part of the message,
// which a transaction spilled to disk keeps.
func withID(err error, decoded bool, id int64) error {
	if !decoded {
		return err
	}
	return fmt.Errorf("token id %d: %w", id, err)
}

// intValue reads an integer column of any width (smallint, integer or
// bigint), so that changing a column's width does not stop the tailer.
func intValue(col string, val []byte, null, binaryFmt bool) (int64, error) {
	if null {
		return 0, fmt.Errorf("%s is NULL", col)
	}
	if binaryFmt {
		switch len(val) {
		case 8:
			return int64(binary.BigEndian.Uint64(val)), nil
		case 4:
			return int64(int32(binary.BigEndian.Uint32(val))), nil
		case 2:
			return int64(int16(binary.BigEndian.Uint16(val))), nil
		}
		return 0, fmt.Errorf("%s: binary integer of %d bytes", col, len(val))
	}
	v, ok := atoi(val)
	if !ok {
		return 0, fmt.Errorf("%s: %q is not an integer", col, val)
	}
	return v, nil
}

func secretValue(dst *[32]byte, val []byte, null, binaryFmt bool) error {
	if null {
		return errors.New("secret is NULL")
	}
	if binaryFmt {
		if len(val) != len(dst) {
			return fmt.Errorf("secret is %d bytes, want %d", len(val), len(dst))
		}
		copy(dst[:], val)
		return nil
	}
	// Text format is bytea's hex output: \x followed by two digits a byte.
	if len(val) < 2 || val[0] != '\\' || val[1] != 'x' {
		return errors.New("secret is not in bytea hex format (bytea_output must be hex)")
	}
	hex := val[2:]
	if len(hex) != 2*len(dst) {
		return fmt.Errorf("secret is %d bytes, want %d", len(hex)/2, len(dst))
	}
	for i := range dst {
		hi, ok1 := unhex(hex[2*i])
		lo, ok2 := unhex(hex[2*i+1])
		if !ok1 || !ok2 {
			return errors.New("secret has a non-hex digit")
		}
		dst[i] = hi<<4 | lo
	}
	return nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// atoi parses a decimal int64 without allocating.
func atoi(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	neg := b[0] == '-'
	if neg {
		b = b[1:]
		if len(b) == 0 {
			return 0, false
		}
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		next := v*10 + uint64(c-'0')
		if next < v || next > 1<<63 {
			return 0, false
		}
		v = next
	}
	if !neg && v > 1<<63-1 {
		return 0, false
	}
	if neg {
		return -int64(v), true
	}
	return int64(v), true
}

// reader reads big-endian pgoutput fields; the first short read sets err and
// makes every later read return zero values.
type reader struct {
	buf []byte
	err error
}

func (r *reader) need(n int) bool {
	if r.err != nil {
		return false
	}
	if n < 0 || len(r.buf) < n {
		r.err = errShort
		return false
	}
	return true
}

var errShort = errors.New("message too short")

func (r *reader) u8() byte {
	if !r.need(1) {
		return 0
	}
	v := r.buf[0]
	r.buf = r.buf[1:]
	return v
}

func (r *reader) u16() uint16 {
	if !r.need(2) {
		return 0
	}
	v := binary.BigEndian.Uint16(r.buf)
	r.buf = r.buf[2:]
	return v
}

func (r *reader) u32() uint32 {
	if !r.need(4) {
		return 0
	}
	v := binary.BigEndian.Uint32(r.buf)
	r.buf = r.buf[4:]
	return v
}

func (r *reader) u64() uint64 {
	if !r.need(8) {
		return 0
	}
	v := binary.BigEndian.Uint64(r.buf)
	r.buf = r.buf[8:]
	return v
}

func (r *reader) bytes(n int) []byte {
	if !r.need(n) {
		return nil
	}
	v := r.buf[:n:n]
	r.buf = r.buf[n:]
	return v
}

func (r *reader) cstring() []byte {
	if r.err != nil {
		return nil
	}
	for i, c := range r.buf {
		if c == 0 {
			v := r.buf[:i:i]
			r.buf = r.buf[i+1:]
			return v
		}
	}
	r.err = errors.New("unterminated string")
	return nil
}

func (r *reader) fail(what string) error {
	return fmt.Errorf("%w: %s: %v", ErrProtocol, what, r.err)
}
