package publish

import (
	"errors"
	"github.com/mailroom/tailer/decoder/wal"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/publish/join"
	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire"
)

// BatchID derives a batch's id from the WAL positions it covers only, so the
// same batch re-sent after a crash has the same id.
func BatchID(first, last wal.Position) string {
	var buf [80]byte
	b := first.AppendText(buf[:0])
	b = append(b, '-')
	return string(last.AppendText(b))
}

// Encoder builds message bodies: one batch, or several consecutive batches
// of one lane, each a line of its own (Begin, Add, Finish). It is not safe
// for concurrent use.
type Encoder struct {
	signer *token.Signer
	format wire.Format
	// The message being built: out is the body (json: the token entries,
	// wrapped by Finish), base where it started in the caller's buffer.
	out, dst []byte
	entries  []byte
	base     int
	budget   int
	limited  bool
	n        int
	ids      []byte
	keys     []byte
	sizes    []byte
	lines    int
	// The traceparents of the tokens so far, in order of their first
	// token, with the tokens of each (wire.HeaderTraceTokens).
	traces     []string
	traceToks  [][]byte
	traceLast  []int
	traceCount []int
	traceIdx   map[string]int
	traceBytes int
}

// NewEncoder returns an Encoder signing with signer.
func NewEncoder(signer *token.Signer, format wire.Format) *Encoder {
	return &Encoder{signer: signer, format: format}
}

// Encoded is one message.
type Encoded struct {
	Body []byte
	// KeyID names the key that signed the tokens.
	KeyID string
	// IDs and Keys are the comma-joined ids and keys of the tokens in Body,
	// Sizes the comma-joined number of tokens of each of its batches.
	IDs, Keys, Sizes string
	// N is the number of tokens in Body, Batches the number of its batches
	// (lines).
	N, Batches int
	// Traces are the distinct traceparents of the tokens' transactions,
	// TraceTokens the tokens of each (see wire.HeaderTraceTokens) and
	// TraceCounts how many they are.
	Traces, TraceTokens []string
	TraceCounts         []int
}

// Bytes a message needs besides its tokens: the other headers and the json
// envelope.
const messageOverhead = 1024

// headerBudget is what the per-token headers (ids, keys) and the batch
// sizes may take: JetStream refuses a message whose headers exceed 64 KiB
// (error 10097) whatever max_payload allows, so a message holds at most
// some 2,700 tokens.
const headerBudget = math.MaxUint16 - messageOverhead

// Begin starts a message whose body is appended to dst[:0] and which, body
// and headers, stays within maxBytes (0: no limit), its headers within
// JetStream's 64 KiB.
func (e *Encoder) Begin(dst []byte, maxBytes int) {
	e.dst, e.n, e.lines = dst[:0], 0, 0
	e.ids, e.keys, e.sizes = e.ids[:0], e.keys[:0], e.sizes[:0]
	e.traces, e.traceToks, e.traceLast, e.traceCount, e.traceBytes = e.traces[:0], e.traceToks[:0], e.traceLast[:0], e.traceCount[:0], 0
	clear(e.traceIdx)
	e.out = e.dst
	if e.format == wire.FormatJSON {
		// Json entries are built apart: Finish wraps them in the envelope
		// that names the message.
		e.out = e.entries[:0]
	}
	e.base = len(e.out)
	e.budget, e.limited = maxBytes-messageOverhead, maxBytes > 0
}

// Add puts the tokens whose row says Publish, starting at tokens[0], into
// the message as one batch, until the message would exceed its size; a
// message's first token always goes in. It returns how many of tokens the
// message covers, skipped ones included: fewer than len(tokens) when the
// message is full. A token that cannot be signed is marked SkipMalformed in
// rows, and in the line format one whose email or login is not
// wire.LineSafe is marked SkipUnsafeField.
func (e *Encoder) Add(tokens []decoder.Token, rows []join.TokenState) (covered int) {
	line := 0
	for i := range tokens {
		r := &rows[i]
		if r.Skip != join.Publish {
			covered = i + 1
			continue
		}
		t := &tokens[i]
		start, idsLen, keysLen, sizesLen := len(e.out), len(e.ids), len(e.keys), len(e.sizes)
		if e.n > 0 {
			sep := byte(',')
			if line == 0 && e.format == wire.FormatLine {
				sep = '\n'
			}
			e.out = append(e.out, sep)
			e.ids = append(e.ids, ',')
			e.keys = append(e.keys, ',')
		}
		if line == 0 && e.lines > 0 {
			e.sizes = append(e.sizes, ',')
		}
		var err error
		if e.format == wire.FormatJSON {
			e.out, err = e.appendJSON(e.out, t, r)
		} else {
			e.out, err = e.appendLine(e.out, t, r)
		}
		if err != nil {
			e.out, e.ids, e.keys, e.sizes = e.out[:start], e.ids[:idsLen], e.keys[:keysLen], e.sizes[:sizesLen]
			r.Skip = join.SkipMalformed
			if errors.Is(err, errUnsafeField) {
				r.Skip = join.SkipUnsafeField
			}
			covered = i + 1
			continue
		}
		e.ids = strconv.AppendInt(e.ids, t.ID, 10)
		e.keys = token.AppendKey(e.keys, &t.Secret)
		headers := len(e.ids) + len(e.keys) + len(e.sizes) + 8
		if t.Trace != "" {
			// At most: a new traceparent, and its token's index.
			headers += e.traceBytes + len(t.Trace) + 16
		}
		if e.n > 0 && (headers > headerBudget || e.limited && len(e.out)-e.base+headers > e.budget) {
			// This token goes into the next message.
			e.out, e.ids, e.keys, e.sizes = e.out[:start], e.ids[:idsLen], e.keys[:keysLen], e.sizes[:sizesLen]
			break
		}
		if line == 0 {
			e.lines++
		}
		if t.Trace != "" {
			e.addTrace(t.Trace)
		}
		line++
		e.n++
		covered = i + 1
	}
	if line > 0 {
		e.sizes = strconv.AppendInt(e.sizes, int64(line), 10)
	}
	return covered
}

// Finish completes the message; id is its id, which the json body repeats.
func (e *Encoder) Finish(id string) Encoded {
	out := e.out
	if e.format == wire.FormatJSON {
		e.entries = e.out
		out = append(e.dst, `{"batch":`...)
		out = appendJSONString(out, []byte(id))
		out = append(out, `,"key_id":`...)
		out = appendJSONString(out, []byte(e.signer.ID()))
		out = append(out, `,"tokens":[`...)
		out = append(out, e.entries...)
		out = append(out, `],"batch_sizes":[`...)
		out = append(out, e.sizes...)
		out = append(out, "]}"...)
	}
	enc := Encoded{Body: out, KeyID: e.signer.ID(), IDs: string(e.ids), Keys: string(e.keys), Sizes: string(e.sizes), N: e.n, Batches: e.lines}
	if len(e.traces) > 0 {
		enc.Traces, enc.TraceCounts = slices.Clone(e.traces), slices.Clone(e.traceCount)
		for _, toks := range e.traceToks {
			enc.TraceTokens = append(enc.TraceTokens, string(toks))
		}
	}
	return enc
}

// addTrace records that the message's next token (index e.n) carries the
// traceparent trace.
func (e *Encoder) addTrace(trace string) {
	if e.traceIdx == nil {
		e.traceIdx = map[string]int{}
	}
	i, ok := e.traceIdx[trace]
	if !ok {
		i = len(e.traces)
		e.traceIdx[trace] = i
		e.traces, e.traceLast, e.traceCount = append(e.traces, trace), append(e.traceLast, -1), append(e.traceCount, 0)
		if i < cap(e.traceToks) {
			// A buffer of an earlier message, reused.
			e.traceToks = e.traceToks[:i+1]
			e.traceToks[i] = e.traceToks[i][:0]
		} else {
			e.traceToks = append(e.traceToks, nil)
		}
		e.traceBytes += len(trace) + 2
	}
	before := len(e.traceToks[i])
	e.traceToks[i] = wire.AppendTokenIndex(e.traceToks[i], e.traceLast[i], e.n)
	e.traceLast[i] = e.n
	e.traceCount[i]++
	e.traceBytes += len(e.traceToks[i]) - before
}

// errUnsafeField is a token whose email or login cannot go into a line.
var errUnsafeField = errors.New("email or login holds " + wire.Unsafe)

func (e *Encoder) appendLine(dst []byte, t *decoder.Token, r *join.TokenState) ([]byte, error) {
	if !wire.LineSafe(r.Email) || !wire.LineSafe(r.Login) {
		return dst, errUnsafeField
	}
	// The action's number, a digit: action.Max is below 10.
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
	dst = token.AppendKey(dst, &t.Secret)
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
