package subscriber

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/decoder/action"
	"github.com/mailroom/tailer/decoder/traceparent"
	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire"
)

// SignedToken is one token of a batch as a reader gets it: signed, with
// the account it is mailed to.
type SignedToken struct {
	ID int64 `json:"id"`
	// Action is the token's action label (action.Actions).
	Action string `json:"action"`
	Email  string `json:"email"`
	Login  string `json:"login"`
	// Token is the signed token: 86 base64url characters.
	Token string `json:"token"`
	// Key is the token's idempotency key (see token.AppendKey): dedup on it.
	Key  string `json:"key"`
	Code string `json:"code"`
	// ExpiresAt is only carried by the json format (0 in line batches).
	ExpiresAt int64 `json:"expires_at"`
	// Traceparent is the W3C traceparent the token's transaction carried
	// (the message's traceparent headers, see wire.HeaderTraceparent), or
	// empty.
	Traceparent string `json:"traceparent,omitempty"`
}

// Decoded is a message as a reader gets it: one batch, or several consecutive batches
// the tailer committed together.
type Decoded struct {
	ID string
	// KeyID names the key that signed the tokens (Mailroom-Key-Id; the
	// json body's key_id); empty from tailers before keyrings.
	KeyID  string
	Tokens []SignedToken
	// Sizes is the number of tokens of each batch, in order; they add up
	// to len(Tokens). Each batch is a line of its own for the mail sender.
	Sizes []int
}

// Lines returns the tokens of each batch.
func (b *Decoded) Lines() [][]SignedToken {
	lines := make([][]SignedToken, 0, len(b.Sizes))
	at := 0
	for _, n := range b.Sizes {
		lines = append(lines, b.Tokens[at:at+n])
		at += n
	}
	return lines
}

// Error is a malformed batch; Field names what is wrong.
type Error struct {
	Field string
	Err   error
}

func (e *Error) Error() string { return "malformed batch: " + e.Field + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

func fieldErr(field string, format string, args ...any) error {
	return &Error{Field: field, Err: fmt.Errorf(format, args...)}
}

// Decode decodes a message from its headers and body. A session marker
// (wire.MarkerSubject) decodes to a batch without tokens. The format comes from
// the Mailroom-Format header (line when absent); line batches take their
// token ids from Mailroom-Token-Ids. The batches' sizes come from
// Mailroom-Batch-Sizes, which a line body's lines and a json body's
// batch_sizes must agree with; a message without them is one batch.
func Decode(h nats.Header, body []byte) (*Decoded, error) {
	if wire.IsMarker(h) {
		return &Decoded{}, nil
	}
	format := h.Get(wire.HeaderFormat)
	if format == "" {
		format = "line"
	}
	var b *Decoded
	var err error
	switch format {
	case "line":
		b, err = decodeLine(h.Get(wire.HeaderTokenIDs), string(body))
	case "json":
		b, err = decodeJSON(body)
	default:
		return nil, fieldErr(wire.HeaderFormat, "unknown format %q", format)
	}
	if err != nil {
		return nil, err
	}
	if b.ID == "" {
		b.ID = h.Get(wire.HeaderMsgID)
	}
	if kid := h.Get(wire.HeaderKeyID); kid != "" {
		if b.KeyID != "" && b.KeyID != kid {
			return nil, fieldErr(wire.HeaderKeyID, "says %q, the body's key_id %q", kid, b.KeyID)
		}
		b.KeyID = kid
	}
	if err := b.fillKeys(h.Get(wire.HeaderTokenKeys)); err != nil {
		return nil, err
	}
	if c := h.Get(wire.HeaderCount); c != "" {
		if n, err := strconv.Atoi(c); err != nil || n != len(b.Tokens) {
			return nil, fieldErr(wire.HeaderCount, "says %q, body holds %d tokens", c, len(b.Tokens))
		}
	}
	if err := b.checkSizes(h.Get(wire.HeaderBatchSizes)); err != nil {
		return nil, err
	}
	b.fillTraces(h)
	return b, nil
}

// fillTraces sets each token's Traceparent from the message's trace
// headers. Headers that do not agree (unequal counts, a value that is not
// a traceparent, an index past the tokens) are passed over: tracing is
// never a reason to refuse a batch, and no token gets a trace it may not
// have had.
func (b *Decoded) fillTraces(h nats.Header) {
	for i := range b.Tokens {
		b.Tokens[i].Traceparent = ""
	}
	traces, tokens := h[wire.HeaderTraceparent], h[wire.HeaderTraceTokens]
	if len(traces) == 0 || len(traces) != len(tokens) {
		return
	}
	at := make([]string, len(b.Tokens))
	for i, tp := range traces {
		if !traceparent.Valid(tp) {
			return
		}
		twice := false
		if err := wire.TraceTokens(tokens[i], len(b.Tokens), func(j int) {
			twice = twice || at[j] != ""
			at[j] = tp
		}); err != nil || twice {
			return
		}
	}
	for i, tp := range at {
		b.Tokens[i].Traceparent = tp
	}
}

// checkSizes sets b.Sizes from the header when the body did not give them,
// and checks that header and body agree and add up to the tokens.
func (b *Decoded) checkSizes(header string) error {
	if header != "" {
		var sizes []int
		for _, f := range strings.Split(header, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n <= 0 {
				return fieldErr(wire.HeaderBatchSizes, "%q is not a list of positive token counts", header)
			}
			sizes = append(sizes, n)
		}
		if b.Sizes != nil && !slices.Equal(sizes, b.Sizes) {
			return fieldErr(wire.HeaderBatchSizes, "says %q, the body's batches hold %v tokens", header, b.Sizes)
		}
		b.Sizes = sizes
	}
	if b.Sizes == nil {
		b.Sizes = []int{len(b.Tokens)}
	}
	sum := 0
	for _, n := range b.Sizes {
		sum += n
	}
	if sum != len(b.Tokens) {
		return fieldErr(wire.HeaderBatchSizes, "batches of %v tokens, body holds %d", b.Sizes, len(b.Tokens))
	}
	return nil
}

// fillKeys derives each token's Key from its token, and checks it against
// the header (or the json "key") when the batch carries one.
func (b *Decoded) fillKeys(header string) error {
	var keys []string
	if header != "" {
		if keys = strings.Split(header, ","); len(keys) != len(b.Tokens) {
			return fieldErr(wire.HeaderTokenKeys, "%d keys for %d tokens", len(keys), len(b.Tokens))
		}
	}
	for i := range b.Tokens {
		t := &b.Tokens[i]
		key, err := token.KeyOf(t.Token)
		if err != nil {
			return fieldErr(fmt.Sprintf("token %d token", i), "%v", err)
		}
		switch {
		case keys != nil && keys[i] != key:
			return fieldErr(wire.HeaderTokenKeys, "key %d is %q, the token's is %q", i, keys[i], key)
		case t.Key != "" && t.Key != key:
			return fieldErr(fmt.Sprintf("token %d key", i), "%q, the token's is %q", t.Key, key)
		}
		t.Key = key
	}
	return nil
}

func decodeLine(idsHeader, body string) (*Decoded, error) {
	if body == "" {
		return nil, fieldErr("body", "empty")
	}
	lines := strings.Split(body, "\n")
	b := &Decoded{Sizes: make([]int, len(lines))}
	var fields []string
	for i, line := range lines {
		f := strings.Split(line, ",")
		if line == "" || len(f)%5 != 0 {
			return nil, fieldErr("body", "line %d: %d comma-separated fields, want 5 per token", i+1, len(f))
		}
		b.Sizes[i] = len(f) / 5
		fields = append(fields, f...)
	}
	n := len(fields) / 5
	if idsHeader == "" {
		return nil, fieldErr(wire.HeaderTokenIDs, "missing: line batches need it for token ids")
	}
	ids := strings.Split(idsHeader, ",")
	if len(ids) != n {
		return nil, fieldErr(wire.HeaderTokenIDs, "%d ids for %d tokens", len(ids), n)
	}
	b.Tokens = make([]SignedToken, n)
	for i := range b.Tokens {
		f := fields[5*i : 5*i+5]
		t := &b.Tokens[i]
		id, err := strconv.ParseInt(ids[i], 10, 64)
		if err != nil {
			return nil, fieldErr(wire.HeaderTokenIDs, "id %d: %q is not an integer", i, ids[i])
		}
		t.ID = id
		a, ok := action.ParseNumber(f[0])
		if !ok {
			return nil, fieldErr(fmt.Sprintf("token %d action", i), "%q, want 1 to %d", f[0], len(action.Actions))
		}
		t.Action = a.String()
		t.Email, t.Login, t.Token, t.Code = f[1], f[2], f[3], f[4]
		if err := t.validate(i); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func decodeJSON(body []byte) (*Decoded, error) {
	var doc struct {
		Batch  *string `json:"batch"`
		KeyID  string  `json:"key_id"`
		Sizes  []int   `json:"batch_sizes"`
		Tokens []struct {
			ID        *int64  `json:"id"`
			Action    string  `json:"action"`
			Email     string  `json:"email"`
			Login     string  `json:"login"`
			Token     string  `json:"token"`
			Key       string  `json:"key"`
			Code      *string `json:"code"`
			ExpiresAt int64   `json:"expires_at"`
		} `json:"tokens"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, fieldErr("body", "not JSON: %v", err)
	}
	if doc.Batch == nil {
		return nil, fieldErr("batch", "missing")
	}
	if len(doc.Tokens) == 0 {
		return nil, fieldErr("tokens", "missing or empty")
	}
	b := &Decoded{ID: *doc.Batch, KeyID: doc.KeyID, Tokens: make([]SignedToken, len(doc.Tokens)), Sizes: doc.Sizes}
	for _, n := range doc.Sizes {
		if n <= 0 {
			return nil, fieldErr("batch_sizes", "%v holds a size that is not positive", doc.Sizes)
		}
	}
	for i, jt := range doc.Tokens {
		if jt.ID == nil {
			return nil, fieldErr(fmt.Sprintf("token %d id", i), "missing")
		}
		t := SignedToken{ID: *jt.ID, Action: jt.Action, Email: jt.Email, Login: jt.Login, Token: jt.Token, Key: jt.Key, ExpiresAt: jt.ExpiresAt}
		if jt.Code != nil {
			t.Code = *jt.Code
		}
		if _, err := action.Parse(t.Action); err != nil {
			return nil, fieldErr(fmt.Sprintf("token %d action", i), "%v", err)
		}
		if err := t.validate(i); err != nil {
			return nil, err
		}
		b.Tokens[i] = t
	}
	return b, nil
}

func (t *SignedToken) validate(i int) error {
	switch {
	case t.Email == "":
		return fieldErr(fmt.Sprintf("token %d email", i), "empty")
	case t.Login == "":
		return fieldErr(fmt.Sprintf("token %d login", i), "empty")
	case len(t.Token) != 86 || strings.Trim(t.Token, base64URL) != "":
		return fieldErr(fmt.Sprintf("token %d token", i), "%d characters, want 86 base64url characters", len(t.Token))
	}
	a, err := action.Parse(t.Action)
	if err != nil {
		return fieldErr(fmt.Sprintf("token %d action", i), "%v", err)
	}
	if spec, _ := a.Spec(); spec.CodeLen > 0 && len(t.Code) != spec.CodeLen {
		return fieldErr(fmt.Sprintf("token %d code", i), "%q, want %d characters for %s", t.Code, spec.CodeLen, spec.Label)
	}
	return nil
}

// AppendLine appends the mailroom collector's line for tokens (without a
// newline): action,email,login,token,code per token, comma-joined. Leave out
// tokens whose email or login is not wire.LineSafe.
func AppendLine(dst []byte, tokens []SignedToken) []byte {
	for i, t := range tokens {
		if i > 0 {
			dst = append(dst, ',')
		}
		// Decoded tokens have a known action; its number is a digit
		// (action.Max is below 10).
		a, _ := action.Parse(t.Action)
		dst = append(dst, '0'+byte(a), ',')
		dst = append(dst, t.Email...)
		dst = append(dst, ',')
		dst = append(dst, t.Login...)
		dst = append(dst, ',')
		dst = append(dst, t.Token...)
		dst = append(dst, ',')
		dst = append(dst, t.Code...)
	}
	return dst
}

// AppendJSON appends a json batch body holding tokens.
func AppendJSON(dst []byte, id string, tokens []SignedToken) ([]byte, error) {
	out, err := json.Marshal(struct {
		Batch  string        `json:"batch"`
		Tokens []SignedToken `json:"tokens"`
	}{id, tokens})
	if err != nil {
		return dst, err
	}
	return append(dst, out...), nil
}

// Dedup remembers the last Size keys it was given, so that a consumer
// processes each token once across redeliveries. Key it on Token.Key, which
// is never reused (token ids are, after TRUNCATE ... RESTART IDENTITY). It
// is not safe for concurrent use.
type Dedup[K comparable] struct {
	ring []K
	next int
	full bool
	seen map[K]struct{}
}

// NewDedup returns a window of size keys (at least 1).
func NewDedup[K comparable](size int) *Dedup[K] {
	size = max(size, 1)
	return &Dedup[K]{ring: make([]K, size), seen: make(map[K]struct{}, size)}
}

// Seen reports whether k is in the window, and adds it if not (evicting the
// oldest key when the window is full).
func (d *Dedup[K]) Seen(k K) bool {
	if _, ok := d.seen[k]; ok {
		return true
	}
	if d.full {
		delete(d.seen, d.ring[d.next])
	}
	d.ring[d.next] = k
	d.seen[k] = struct{}{}
	d.next++
	if d.next == len(d.ring) {
		d.next, d.full = 0, true
	}
	return false
}

// Contains reports whether k is in the window without adding it.
func (d *Dedup[K]) Contains(k K) bool {
	_, ok := d.seen[k]
	return ok
}

// ErrNotMailroom is returned by DecodeLine for a line that is not a
// collector line.
var ErrNotMailroom = errors.New("not a mailroom line")

// DecodeLine parses a collector line (as written by tailer subscribe) into
// tokens without ids; it lets a consumer reread its own output.
func DecodeLine(line string) ([]SignedToken, error) {
	fields := strings.Split(line, ",")
	if line == "" || len(fields)%5 != 0 {
		return nil, ErrNotMailroom
	}
	tokens := make([]SignedToken, len(fields)/5)
	for i := range tokens {
		f := fields[5*i : 5*i+5]
		a, ok := action.ParseNumber(f[0])
		if !ok {
			return nil, ErrNotMailroom
		}
		tokens[i] = SignedToken{Action: a.String(), Email: f[1], Login: f[2], Token: f[3], Code: f[4]}
	}
	return tokens, nil
}
