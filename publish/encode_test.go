package publish

import (
	"github.com/mailroom/tailer/decoder/wal"
	"slices"
	"strings"
	"testing"

	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/decoder/action"
	"github.com/mailroom/tailer/publish/join"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire"
)

func testEncoder(t *testing.T, format wire.Format) *Encoder {
	t.Helper()
	key, _ := token.ParseKey(strings.Repeat("cafebabe", 8))
	signer, err := token.NewSigner("k", key)
	if err != nil {
		t.Fatal(err)
	}
	return NewEncoder(signer, format)
}

// encodeOne encodes one message of tokens; it returns the message and how
// many tokens it covers.
func encodeOne(e *Encoder, id func(covered int) string, tokens []decoder.Token, rows []join.TokenState, maxBytes int) (Encoded, int) {
	e.Begin(nil, maxBytes)
	covered := e.Add(tokens, rows)
	return e.Finish(id(covered)), covered
}

func testTokens(n int) []decoder.Token {
	tokens := make([]decoder.Token, n)
	for i := range tokens {
		tokens[i] = decoder.Token{Pos: wal.Position{Commit: 0x1000, Index: uint32(i)}, ID: int64(i + 1), Action: action.Activation}
		tokens[i].Secret[0], tokens[i].Secret[1] = byte(i), byte(i>>8)
	}
	return tokens
}

// A field the sender would misparse never goes into a line; the other
// tokens of the batch do, and JSON carries it.
func TestEncodeUnsafeField(t *testing.T) {
	tokens := testTokens(5)
	fields := [][2]string{
		{"a@example.com", "a"},
		{"b,x@example.com", "b"},
		{"c@example.com", "c\n1,forged@example.com,f," + strings.Repeat("A", 86) + ",00000"},
		{strings.Repeat("é", 128) + "@example.com", "d"},
		{"e@example.com", "e"},
	}
	rows := func() []join.TokenState {
		r := make([]join.TokenState, len(fields))
		for i, f := range fields {
			r[i] = join.TokenState{Email: []byte(f[0]), Login: []byte(f[1])}
		}
		return r
	}
	id := func(int) string { return "x" }

	r := rows()
	enc, covered := encodeOne(testEncoder(t, wire.FormatLine), id, tokens, r, 0)
	if enc.N != 2 || covered != 5 || enc.IDs != "1,5" || enc.Sizes != "2" {
		t.Fatalf("line: %d tokens (ids %s, sizes %s) covering %d, want tokens 1 and 5 covering 5", enc.N, enc.IDs, enc.Sizes, covered)
	}
	for i, want := range []join.Skip{join.Publish, join.SkipUnsafeField, join.SkipUnsafeField, join.SkipUnsafeField, join.Publish} {
		if r[i].Skip != want {
			t.Errorf("token %d: %v, want %v", i+1, r[i].Skip, want)
		}
	}
	if fields := strings.Split(string(enc.Body), ","); len(fields) != 10 || strings.ContainsAny(string(enc.Body), "\r\n\x00") {
		t.Fatalf("line body %q: %d fields, want 10", enc.Body, len(fields))
	}

	r = rows()
	enc, _ = encodeOne(testEncoder(t, wire.FormatJSON), id, tokens, r, 0)
	if enc.N != 5 {
		t.Fatalf("json: %d tokens, want all 5", enc.N)
	}
	if _, err := subscriber.Decode(map[string][]string{wire.HeaderFormat: {"json"}, wire.HeaderTokenKeys: {enc.Keys}}, enc.Body); err != nil {
		t.Fatalf("json body does not decode: %v", err)
	}
}

// A batch whose body would exceed the message size goes out as several
// messages, each covering a contiguous run of the batch, skipped tokens
// included, and each within the limit.
func TestEncodeSplitsByBytes(t *testing.T) {
	const maxBytes = 16 << 10
	for _, format := range []wire.Format{wire.FormatLine, wire.FormatJSON} {
		t.Run(format.String(), func(t *testing.T) {
			tokens := testTokens(300)
			rows := make([]join.TokenState, len(tokens))
			for i := range rows {
				rows[i] = join.TokenState{Email: []byte(strings.Repeat("e", 240)), Login: []byte(strings.Repeat("l", 240))}
				if i%7 == 0 {
					rows[i].Skip = join.SkipExpired
				}
			}
			e := testEncoder(t, format)
			published, messages := 0, 0
			for start := 0; start < len(tokens); messages++ {
				var first, last wal.Position
				enc, covered := encodeOne(e, func(covered int) string {
					first, last = tokens[start].Pos, tokens[start+covered-1].Pos
					return BatchID(first, last)
				}, tokens[start:], rows[start:], maxBytes)
				if size := len(enc.Body) + len(enc.IDs) + len(enc.Keys) + len(enc.Sizes); size > maxBytes-messageOverhead {
					t.Fatalf("message %d: %d bytes of body and token headers, limit %d", messages, size, maxBytes-messageOverhead)
				}
				if covered == 0 {
					t.Fatal("a message covers no token")
				}
				if format == wire.FormatJSON {
					b, err := subscriber.Decode(map[string][]string{wire.HeaderFormat: {"json"}}, enc.Body)
					if err != nil || len(b.Tokens) != enc.N || b.ID != BatchID(first, last) {
						t.Fatalf("message %d: %v (%d tokens, id %q)", messages, err, enc.N, b.ID)
					}
				}
				published += enc.N
				start += covered
			}
			if want := 300 - 43; published != want || messages < 10 {
				t.Fatalf("%d tokens in %d messages, want %d in at least 10", published, messages, want)
			}
		})
	}
}

// JetStream refuses headers over 64 KiB whatever the payload limit: a batch
// (or a group) of thousands of tokens goes out in several messages, each
// with its ids and keys within it.
func TestEncodeSplitsByHeaderSize(t *testing.T) {
	tokens := testTokens(6000)
	rows := make([]join.TokenState, len(tokens))
	for i := range rows {
		rows[i] = join.TokenState{Email: []byte("a@example.com"), Login: []byte("a")}
	}
	e := testEncoder(t, wire.FormatLine)
	published, messages := 0, 0
	for start := 0; start < len(tokens); messages++ {
		enc, covered := encodeOne(e, func(int) string { return "x" }, tokens[start:], rows[start:], 0)
		if size := len(enc.IDs) + len(enc.Keys) + len(enc.Sizes); size > headerBudget {
			t.Fatalf("message %d: %d bytes of token headers, limit %d", messages, size, headerBudget)
		}
		published += enc.N
		start += covered
	}
	if published != 6000 || messages < 3 {
		t.Fatalf("%d tokens in %d messages, want 6000 in at least 3", published, messages)
	}
}

// The tokens' traceparents go into the message as one value per distinct
// traceparent, with the tokens of each; a consumer reads them back onto
// its tokens. Skipped and untraced tokens carry none.
func TestEncodeTraces(t *testing.T) {
	const (
		a = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		b = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
	)
	tokens := testTokens(6)
	for i, tr := range []string{a, "", a, b, b, a} {
		tokens[i].Trace = tr
	}
	rows := make([]join.TokenState, 6)
	for i := range rows {
		rows[i] = join.TokenState{Email: []byte("x@example.com"), Login: []byte("x")}
	}
	rows[2].Email = []byte("bad,comma@example.com") // skipped in a line
	e := testEncoder(t, wire.FormatLine)
	for round := range 2 { // the second reuses the encoder's buffers
		e.Begin(nil, 0)
		e.Add(tokens[:4], rows[:4])
		e.Add(tokens[4:], rows[4:])
		enc := e.Finish("m")
		if !slices.Equal(enc.Traces, []string{a, b}) || !slices.Equal(enc.TraceTokens, []string{"0,4", "2-3"}) {
			t.Fatalf("round %d: traces %q tokens %q, want [a b] [0,4 2-3]", round, enc.Traces, enc.TraceTokens)
		}
		batch, err := subscriber.Decode(map[string][]string{wire.HeaderTokenIDs: {enc.IDs}, wire.HeaderTokenKeys: {enc.Keys}, wire.HeaderBatchSizes: {enc.Sizes},
			wire.HeaderTraceparent: enc.Traces, wire.HeaderTraceTokens: enc.TraceTokens}, enc.Body)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, tok := range batch.Tokens {
			got = append(got, tok.Traceparent)
		}
		if !slices.Equal(got, []string{a, "", b, b, a}) {
			t.Fatalf("round %d: the consumer reads %q", round, got)
		}
		for i := range rows {
			rows[i].Skip = join.Publish
		}
	}
	// A message without traced tokens has no trace headers.
	e.Begin(nil, 0)
	e.Add(testTokens(3), rows[:3])
	if enc := e.Finish("m"); enc.Traces != nil || enc.TraceTokens != nil {
		t.Fatalf("untraced: %q %q", enc.Traces, enc.TraceTokens)
	}
}
