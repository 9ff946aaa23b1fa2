package publish

import (
	"errors"
	"strconv"
	"unicode/utf8"

	"github.com/mailroom/tailer/batch/join"
	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/publish/wire"
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
	signer  *Signer
	format  wire.Format
	ids     []byte
	keys    []byte
	entries []byte
}

// NewEncoder returns an Encoder signing with signer.
func NewEncoder(signer *Signer, format wire.Format) *Encoder {
	return &Encoder{signer: signer, format: format}
}

// Encoded is one message's worth of a batch.
type Encoded struct {
	Body []byte
	// IDs and Keys are the comma-joined ids and keys of the tokens in Body.
	IDs, Keys string
	// N is the number of tokens in Body; Covered the number of tokens of
	// the batch the message stands for, skipped ones included.
	N, Covered int
}

// Bytes a message needs besides its tokens: the other headers and the json
// envelope.
const messageOverhead = 1024

// Encode appends to dst the body for the tokens whose row says Publish,
// starting at tokens[0], until the body and its per-token headers would
// exceed maxBytes (0: no limit); at least one token is always taken. A token
// that cannot be signed is marked SkipMalformed in rows, and in the line
// format one whose email or login is not wire.LineSafe is marked
// SkipUnsafeField. id is the message's id, which the json body repeats; it
// is called with the positions the message covers once they are known.
func (e *Encoder) Encode(dst []byte, id func(covered int) string, tokens []decoder.Token, rows []join.TokenState, maxBytes int) Encoded {
	e.ids, e.keys, e.entries = e.ids[:0], e.keys[:0], e.entries[:0]
	// Line bodies are the entries themselves; json ones get an envelope
	// that names the message, so their entries are built apart.
	out := dst
	if e.format == wire.FormatJSON {
		out = e.entries
	}
	base := len(out)
	budget := maxBytes - messageOverhead
	var enc Encoded
	for i := range tokens {
		r := &rows[i]
		if r.Skip != join.Publish {
			enc.Covered = i + 1
			continue
		}
		t := &tokens[i]
		start, idsLen, keysLen := len(out), len(e.ids), len(e.keys)
		if enc.N > 0 {
			out = append(out, ',')
			e.ids = append(e.ids, ',')
			e.keys = append(e.keys, ',')
		}
		var err error
		if e.format == wire.FormatJSON {
			out, err = e.appendJSON(out, t, r)
		} else {
			out, err = e.appendLine(out, t, r)
		}
		if err != nil {
			out, e.ids, e.keys = out[:start], e.ids[:idsLen], e.keys[:keysLen]
			r.Skip = join.SkipMalformed
			if errors.Is(err, errUnsafeField) {
				r.Skip = join.SkipUnsafeField
			}
			enc.Covered = i + 1
			continue
		}
		e.ids = strconv.AppendInt(e.ids, t.ID, 10)
		e.keys = wire.AppendKey(e.keys, &t.Secret)
		if maxBytes > 0 && enc.N > 0 && len(out)-base+len(e.ids)+len(e.keys) > budget {
			// This token goes into the next message.
			out, e.ids, e.keys = out[:start], e.ids[:idsLen], e.keys[:keysLen]
			break
		}
		enc.N++
		enc.Covered = i + 1
	}
	if e.format == wire.FormatJSON {
		e.entries = out
		out = append(dst, `{"batch":`...)
		out = appendJSONString(out, []byte(id(enc.Covered)))
		out = append(out, `,"tokens":[`...)
		out = append(out, e.entries...)
		out = append(out, "]}"...)
	}
	enc.Body, enc.IDs, enc.Keys = out, string(e.ids), string(e.keys)
	return enc
}

// errUnsafeField is a token whose email or login cannot go into a line.
var errUnsafeField = errors.New("email or login holds a comma, CR, LF or NUL, or exceeds 254 bytes")

func (e *Encoder) appendLine(dst []byte, t *decoder.Token, r *join.TokenState) ([]byte, error) {
	if !wire.LineSafe(r.Email) || !wire.LineSafe(r.Login) {
		return dst, errUnsafeField
	}
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

func (e *Encoder) appendJSON(dst []byte, t *decoder.Token, r *join.TokenState) ([]byte, error) {
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
	dst = append(dst, `","key":"`...)
	dst = wire.AppendKey(dst, &t.Secret)
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
