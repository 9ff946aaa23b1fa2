package decoder

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/mailroom/tailer/decoder/action"
)

// FuzzDecodeAgainstPglogrepl decodes a token insert, well formed or
// corrupted (cut short, one byte changed), with the decoder and with
// pglogrepl's parser as the oracle: where pglogrepl reads the tuple, the
// token the decoder publishes holds what the tuple holds (read by the
// plainest rules: strconv, encoding/hex), and a row the oracle rejects is
// never published; where pglogrepl cannot read the message, neither does
// the decoder publish a token from it.
func FuzzDecodeAgainstPglogrepl(f *testing.F) {
	f.Add(int64(1), int64(7), true, secret(1), "12345", false, true, uint16(0xffff), uint16(0), byte(0))
	f.Add(int64(-5), int64(1<<40), false, secret(9), "", true, false, uint16(0xffff), uint16(0), byte(0))
	f.Add(int64(3), int64(3), true, secret(3), "12345", false, false, uint16(0xffff), uint16(9), byte('b'))
	f.Add(int64(4), int64(4), true, secret(4), "1234", false, true, uint16(40), uint16(0), byte(0))
	f.Add(int64(5), int64(5), false, []byte("short"), "", true, true, uint16(0xffff), uint16(0), byte(0))
	f.Fuzz(func(t *testing.T, id, account int64, recovery bool, sec []byte, code string, codeNull, bin bool, cut, flipAt uint16, flipTo byte) {
		action := "activation"
		if recovery {
			action = "password_recovery"
		}
		codeCol := text(code)
		switch {
		case codeNull:
			codeCol = null()
		case bin:
			codeCol = binv([]byte(code))
		}
		row := textRow(id, action, sec, codeCol, account)
		if bin {
			row = binRow(id, action, sec, codeCol, account)
		}
		ins := insertMsg(0, 1, row...)
		if int(flipAt) > 0 && int(flipAt) < len(ins) {
			ins[flipAt] = flipTo
		}
		if int(cut) < len(ins) {
			ins = ins[:cut]
		}

		d := New("public", "tokens")
		defer d.Close()
		rec := &recorder{}
		var ours error
		for _, m := range [][]byte{relationMsg(0, 1, "public", "tokens", tokenCols...), begin(0x100, 5), ins, commit(0x100, 0x108)} {
			if ours = d.Decode(m, rec); ours != nil {
				break
			}
		}
		if ours != nil && !errors.Is(ours, ErrProtocol) {
			t.Fatalf("decoder error %v is not ErrProtocol", ours)
		}

		msg, perr := parseV2(ins)
		insert, ok := msg.(*pglogrepl.InsertMessageV2)
		if perr == nil && ok && insert.Tuple != nil && !knownKinds(insert.Tuple) {
			// pglogrepl takes a column kind PostgreSQL never sends as a
			// value without data; the decoder refuses it.
			perr = errors.New("a column kind other than n, u, t or b")
		}
		if perr != nil || !ok || insert.Tuple == nil || insert.RelationID != 1 {
			if len(rec.tokens) != 0 {
				t.Fatalf("pglogrepl cannot read the insert (%v), the decoder published %+v", perr, rec.tokens)
			}
			return
		}
		want, rowErr := oracleToken(insert.Tuple)
		switch {
		case rowErr != nil && len(rec.tokens) != 0:
			t.Fatalf("the oracle rejects the row (%v), the decoder published %+v", rowErr, rec.tokens[0])
		case rowErr == nil && ours != nil:
			// pglogrepl reads a tuple, then stops: bytes after it, or a
			// column count it does not check against the bytes, are the
			// decoder's to refuse.
			if !trailingOrShort(ins) {
				t.Fatalf("the oracle reads %+v, the decoder fails: %v", want, ours)
			}
		case rowErr == nil && len(rec.tokens) != 1:
			t.Fatalf("the oracle reads %+v, the decoder published %d tokens (bad rows %v)", want, len(rec.tokens), rec.bad)
		case rowErr == nil:
			got := rec.tokens[0]
			if got.ID != want.ID || got.Account != want.Account || got.Action != want.Action || got.Secret != want.Secret ||
				got.CodeNull != want.CodeNull || !bytes.Equal(got.Code[:got.CodeLen], want.Code[:want.CodeLen]) {
				t.Fatalf("decoder %+v, oracle %+v", got, want)
			}
		}
	})
}

// parseV2 is pglogrepl.ParseV2, which panics on some malformed messages
// (an index past a cut tuple): that is its way of saying it cannot read
// them.
func parseV2(data []byte) (msg pglogrepl.Message, err error) {
	if lengthPastEnd(data) {
		// pglogrepl would allocate what the length says (gigabytes) before
		// finding the message too short.
		return nil, errors.New("a column length past the message's end")
	}
	defer func() {
		if r := recover(); r != nil {
			msg, err = nil, fmt.Errorf("pglogrepl panicked: %v", r)
		}
	}()
	return pglogrepl.ParseV2(data, false)
}

func knownKinds(tuple *pglogrepl.TupleData) bool {
	for _, c := range tuple.Columns {
		if !bytes.ContainsRune([]byte("nutb"), rune(c.DataType)) {
			return false
		}
	}
	return true
}

// lengthPastEnd reports whether an insert message declares a column
// value longer than what is left of it.
func lengthPastEnd(ins []byte) bool {
	at := 1 + 4 + 1 + 2
	if len(ins) < at || ins[0] != 'I' {
		return false
	}
	for n := int(ins[6])<<8 | int(ins[7]); n > 0 && at < len(ins); n-- {
		kind := ins[at]
		at++
		if kind != 't' && kind != 'b' {
			continue
		}
		if at+4 > len(ins) {
			return false
		}
		size := uint64(ins[at])<<24 | uint64(ins[at+1])<<16 | uint64(ins[at+2])<<8 | uint64(ins[at+3])
		at += 4
		if size > uint64(len(ins)-at) {
			return true
		}
		at += int(size)
	}
	return false
}

// trailingOrShort reports whether pglogrepl would accept ins although its
// tuple does not end exactly at the message's end: its column count says
// fewer columns than follow, or the last ones are missing.
func trailingOrShort(ins []byte) bool {
	msg, err := parseV2(ins)
	if err != nil {
		return false
	}
	n := 1 + 4 + 1 + 2 // 'I', relation, 'N', column count
	for _, c := range msg.(*pglogrepl.InsertMessageV2).Tuple.Columns {
		n++
		if c.DataType == 't' || c.DataType == 'b' {
			n += 4 + len(c.Data)
		}
	}
	return n != len(ins)
}

// oracleToken reads a token from a tuple of the tokens relation (columns
// in tokenCols order) with the standard library.
func oracleToken(tuple *pglogrepl.TupleData) (Token, error) {
	var tok Token
	cols := tuple.Columns
	if len(cols) < 5 {
		return tok, fmt.Errorf("%d columns", len(cols))
	}
	value := func(i int) ([]byte, bool, bool) { // data, null, binary
		c := cols[i]
		return c.Data, c.DataType != 't' && c.DataType != 'b', c.DataType == 'b'
	}
	integer := func(i int) (int64, error) {
		v, null, bin := value(i)
		switch {
		case null:
			return 0, errors.New("NULL")
		case bin && len(v) == 8:
			return int64(uint64(v[0])<<56 | uint64(v[1])<<48 | uint64(v[2])<<40 | uint64(v[3])<<32 | uint64(v[4])<<24 | uint64(v[5])<<16 | uint64(v[6])<<8 | uint64(v[7])), nil
		case bin && len(v) == 4:
			return int64(int32(uint32(v[0])<<24 | uint32(v[1])<<16 | uint32(v[2])<<8 | uint32(v[3]))), nil
		case bin && len(v) == 2:
			return int64(int16(uint16(v[0])<<8 | uint16(v[1]))), nil
		case bin:
			return 0, fmt.Errorf("binary integer of %d bytes", len(v))
		}
		if len(v) > 0 && v[0] == '+' {
			return 0, errors.New("PostgreSQL does not write a plus sign")
		}
		return strconv.ParseInt(string(v), 10, 64)
	}
	var err error
	if tok.ID, err = integer(0); err != nil {
		return tok, fmt.Errorf("id: %w", err)
	}
	if tok.Account, err = integer(4); err != nil {
		return tok, fmt.Errorf("account: %w", err)
	}
	v, null, bin := value(1)
	switch {
	case null:
		return tok, errors.New("action NULL")
	case string(v) == "activation":
		tok.Action = action.Activation
	case string(v) == "password_recovery":
		tok.Action = action.PasswordRecovery
	default:
		return tok, fmt.Errorf("action %q", v)
	}
	v, null, bin = value(2)
	if null {
		return tok, errors.New("secret NULL")
	}
	if !bin {
		if !bytes.HasPrefix(v, []byte(`\x`)) {
			return tok, errors.New("secret not hex")
		}
		if v, err = hex.DecodeString(string(v[2:])); err != nil {
			return tok, fmt.Errorf("secret: %w", err)
		}
	}
	if len(v) != len(tok.Secret) {
		return tok, fmt.Errorf("secret of %d bytes", len(v))
	}
	copy(tok.Secret[:], v)
	v, null, _ = value(3)
	switch {
	case null:
		tok.CodeNull = true
	case len(v) > len(tok.Code):
		return tok, fmt.Errorf("code of %d bytes", len(v))
	default:
		tok.CodeLen = uint8(copy(tok.Code[:], v))
	}
	if tok.Action == action.PasswordRecovery && (tok.CodeNull || tok.CodeLen != 5) {
		return tok, errors.New("recovery code not 5 bytes")
	}
	return tok, nil
}
