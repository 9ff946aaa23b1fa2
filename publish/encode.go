package publish

import (
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/mailroom/tailer/batch/accounts"
	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/publish/consume"
)

// Format is the body format of a published batch.
type Format uint8

const (
	// FormatLine is the mailroom collector's batch line without its
	// newline: action,email,login,token,code for every token, comma-joined.
	FormatLine Format = iota
	// FormatJSON is {"batch": id, "tokens": [{id, action, email, login,
	// token, code, expires_at}, ...]}.
	FormatJSON
)

// ParseFormat parses "line" or "json".
func ParseFormat(s string) (Format, error) {
	switch s {
	case "line":
		return FormatLine, nil
	case "json":
		return FormatJSON, nil
	}
	return 0, fmt.Errorf("%q is not a format: use line or json", s)
}

func (f Format) String() string {
	if f == FormatJSON {
		return "json"
	}
	return "line"
}

// Header names of a published batch; consumers find the same names in
// package consume.
const (
	HeaderMsgID    = consume.HeaderMsgID
	HeaderCount    = consume.HeaderCount
	HeaderTokenIDs = consume.HeaderTokenIDs
	HeaderFormat   = consume.HeaderFormat
	// HeaderPosFirst and HeaderPosLast give the WAL positions (LSN:index)
	// of the first and last token the batch covers, published or skipped.
	HeaderPosFirst = "Mailroom-Pos-First"
	HeaderPosLast  = "Mailroom-Pos-Last"
)

// BatchID derives a batch's id from the WAL positions it covers only, so the
// same batch re-sent after a crash has the same id.
func BatchID(first, last decoder.Position) string {
	var buf [80]byte
	b := first.AppendText(buf[:0])
	b = append(b, '-')
	return string(last.AppendText(b))
}

// Encoder builds batch bodies. It is not safe for concurrent use.
type Encoder struct {
	signer *Signer
	format Format
	ids    []byte
}

// NewEncoder returns an Encoder signing with signer.
func NewEncoder(signer *Signer, format Format) *Encoder {
	return &Encoder{signer: signer, format: format}
}

// Encode appends the body for the tokens whose row says Publish to dst and
// returns it with the comma-joined ids of the tokens it holds and their
// count. A token that cannot be signed is marked SkipMalformed in rows.
func (e *Encoder) Encode(dst []byte, id string, tokens []decoder.Token, rows []accounts.Row) (body []byte, ids string, n int) {
	e.ids = e.ids[:0]
	if e.format == FormatJSON {
		dst = append(dst, `{"batch":`...)
		dst = appendJSONString(dst, []byte(id))
		dst = append(dst, `,"tokens":[`...)
	}
	for i := range tokens {
		r := &rows[i]
		if r.Skip != accounts.Publish {
			continue
		}
		t := &tokens[i]
		start := len(dst)
		if n > 0 {
			dst = append(dst, ',')
		}
		var err error
		if e.format == FormatJSON {
			dst, err = e.appendJSON(dst, t, r)
		} else {
			dst, err = e.appendLine(dst, t, r)
		}
		if err != nil {
			dst = dst[:start]
			r.Skip = accounts.SkipMalformed
			continue
		}
		if n > 0 {
			e.ids = append(e.ids, ',')
		}
		e.ids = strconv.AppendInt(e.ids, t.ID, 10)
		n++
	}
	if e.format == FormatJSON {
		dst = append(dst, "]}"...)
	}
	return dst, string(e.ids), n
}

func (e *Encoder) appendLine(dst []byte, t *decoder.Token, r *accounts.Row) ([]byte, error) {
	dst = append(dst, '0'+byte(t.Action), ',')
	dst = append(dst, r.Email...)
	dst = append(dst, ',')
	dst = append(dst, r.Login...)
	dst = append(dst, ',')
	dst, err := e.signer.AppendToken(dst, t.Action, &t.Secret, t.Code[:t.CodeLen])
	if err != nil {
		return dst, err
	}
	dst = append(dst, ',')
	return append(dst, t.Code[:t.CodeLen]...), nil
}

func (e *Encoder) appendJSON(dst []byte, t *decoder.Token, r *accounts.Row) ([]byte, error) {
	dst = append(dst, `{"id":`...)
	dst = strconv.AppendInt(dst, t.ID, 10)
	dst = append(dst, `,"action":"`...)
	dst = append(dst, t.Action.String()...)
	dst = append(dst, `","email":`...)
	dst = appendJSONString(dst, r.Email)
	dst = append(dst, `,"login":`...)
	dst = appendJSONString(dst, r.Login)
	dst = append(dst, `,"token":"`...)
	dst, err := e.signer.AppendToken(dst, t.Action, &t.Secret, t.Code[:t.CodeLen])
	if err != nil {
		return dst, err
	}
	dst = append(dst, `","code":`...)
	if t.CodeNull {
		dst = append(dst, "null"...)
	} else {
		dst = appendJSONString(dst, t.Code[:t.CodeLen])
	}
	dst = append(dst, `,"expires_at":`...)
	dst = strconv.AppendInt(dst, r.ExpiresAt, 10)
	return append(dst, '}'), nil
}

// appendJSONString appends s as a JSON string.
func appendJSONString(dst []byte, s []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c < 0x20:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, `\ufffd`...)
		} else {
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}
