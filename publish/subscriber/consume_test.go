package subscriber_test

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/decoder/action"
	"github.com/mailroom/tailer/publish"
	"github.com/mailroom/tailer/publish/join"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire"
)

func testSigner() *token.Signer {
	key, _ := token.ParseKey(strings.Repeat("cafebabe", 8))
	s, _ := token.NewSigner("k", key)
	return s
}

// encoded builds a batch the way the tailer publishes it.
func encoded(t testing.TB, format wire.Format) (nats.Header, []byte, []decoder.Token, []join.TokenState) {
	t.Helper()
	signer := testSigner()
	tokens := []decoder.Token{
		{ID: 7, Action: action.Activation, Code: [5]byte{'0', '1', '2', '3', '4'}, CodeLen: 5},
		{ID: 9, Action: action.PasswordRecovery, Code: [5]byte{'9', '8', '7', '6', '5'}, CodeLen: 5},
		{ID: 11, Action: action.Activation, CodeNull: true},
	}
	for i := range tokens {
		tokens[i].Secret[0] = byte(i + 1)
	}
	rows := []join.TokenState{
		{Email: []byte("a@example.com"), Login: []byte("a"), ExpiresAt: 100},
		{Email: []byte(`q"uote@example.com`), Login: []byte("b"), ExpiresAt: 200},
		{Email: []byte("c@example.com"), Login: []byte("c"), ExpiresAt: 300},
	}
	// Two batches committed together: tokens 7 and 9, then 11.
	e := publish.NewEncoder(signer, format)
	e.Begin(nil, 0)
	e.Add(tokens[:2], rows[:2])
	e.Add(tokens[2:], rows[2:])
	enc := e.Finish("0/10:0-0/10:2")
	h := nats.Header{}
	h.Set(wire.HeaderBatchSizes, enc.Sizes)
	h.Set(wire.HeaderMsgID, "0/10:0-0/10:2")
	h.Set(wire.HeaderTokenIDs, enc.IDs)
	h.Set(wire.HeaderTokenKeys, enc.Keys)
	h.Set(wire.HeaderCount, strconv.Itoa(enc.N))
	h.Set(wire.HeaderFormat, format.String())
	h.Set(wire.HeaderKeyID, enc.KeyID)
	return h, enc.Body, tokens, rows
}

func TestRoundTrip(t *testing.T) {
	for _, format := range []wire.Format{wire.FormatLine, wire.FormatJSON} {
		t.Run(format.String(), func(t *testing.T) {
			h, body, tokens, rows := encoded(t, format)
			b, err := subscriber.Decode(h, body)
			if err != nil {
				t.Fatalf("Decode(%s): %v", body, err)
			}
			if b.ID != "0/10:0-0/10:2" || b.KeyID != "k" || len(b.Tokens) != 3 || !slices.Equal(b.Sizes, []int{2, 1}) {
				t.Fatalf("batch = %+v", b)
			}
			for i, tok := range b.Tokens {
				if tok.ID != tokens[i].ID || tok.Action != tokens[i].Action.String() || tok.Email != string(rows[i].Email) ||
					tok.Login != string(rows[i].Login) || tok.Code != tokens[i].CodeString() || len(tok.Token) != 86 {
					t.Errorf("token %d = %+v", i, tok)
				}
				if _, err := testSigner().Verify(tok.Token, action.Action(tokens[i].Action), tok.Code); err != nil {
					t.Errorf("token %d does not verify: %v", i, err)
				}
				if want := string(token.AppendKey(nil, &tokens[i].Secret)); tok.Key != want || len(want) != token.KeyLen {
					t.Errorf("token %d key %q, want %q", i, tok.Key, want)
				}
				if format == wire.FormatJSON && tok.ExpiresAt != rows[i].ExpiresAt {
					t.Errorf("token %d expires_at %d", i, tok.ExpiresAt)
				}
			}
			// Re-encoding gives back the same bytes.
			var again []byte
			if format == wire.FormatLine {
				lines := b.Lines()
				again = subscriber.AppendLine(nil, lines[0])
				if back, err := subscriber.DecodeLine(string(again)); err != nil || len(back) != 2 || back[1].Token != b.Tokens[1].Token {
					t.Errorf("DecodeLine = %+v, %v", back, err)
				}
				again = subscriber.AppendLine(append(again, '\n'), lines[1])
			} else {
				again, err = subscriber.AppendJSON(nil, b.ID, b.Tokens)
				if err != nil {
					t.Fatal(err)
				}
				b2, err := subscriber.Decode(h, again)
				if err != nil || len(b2.Tokens) != 3 || b2.Tokens[2] != b.Tokens[2] {
					t.Fatalf("json round trip: %+v, %v", b2, err)
				}
				return
			}
			if string(again) != string(body) {
				t.Errorf("re-encoded\n%s\nwant\n%s", again, body)
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	lineH, lineBody, _, _ := encoded(t, wire.FormatLine)
	jsonH, jsonBody, _, _ := encoded(t, wire.FormatJSON)
	tok := string(lineBody[strings.Index(string(lineBody), ",a,")+3:][:86])
	with := func(h nats.Header, k, v string) nats.Header {
		c := nats.Header{}
		for kk, vv := range h {
			c[kk] = vv
		}
		c.Set(k, v)
		return c
	}
	for _, tc := range []struct {
		name  string
		h     nats.Header
		body  string
		field string
	}{
		{"empty line", lineH, "", "body"},
		{"empty second line", lineH, string(lineBody[:strings.IndexByte(string(lineBody), '\n')]) + "\n", "body"},
		{"sizes header", with(lineH, wire.HeaderBatchSizes, "1,2"), string(lineBody), wire.HeaderBatchSizes},
		{"sizes not numbers", with(lineH, wire.HeaderBatchSizes, "2,x"), string(lineBody), wire.HeaderBatchSizes},
		{"sizes zero", with(lineH, wire.HeaderBatchSizes, "3,0"), strings.Replace(string(lineBody), "\n", ",", 1), wire.HeaderBatchSizes},
		{"json sizes header", with(jsonH, wire.HeaderBatchSizes, "3"), string(jsonBody), wire.HeaderBatchSizes},
		{"json sizes sum", with(jsonH, wire.HeaderBatchSizes, ""), strings.Replace(string(jsonBody), `"batch_sizes":[2,1]`, `"batch_sizes":[2,2]`, 1), wire.HeaderBatchSizes},
		{"json sizes zero", with(jsonH, wire.HeaderBatchSizes, ""), strings.Replace(string(jsonBody), `"batch_sizes":[2,1]`, `"batch_sizes":[3,0]`, 1), "batch_sizes"},
		{"field count", lineH, "1,a@x,a," + tok, "body"},
		{"no ids", with(lineH, wire.HeaderTokenIDs, ""), string(lineBody), wire.HeaderTokenIDs},
		{"id count", with(lineH, wire.HeaderTokenIDs, "1,2"), string(lineBody), wire.HeaderTokenIDs},
		{"bad id", with(lineH, wire.HeaderTokenIDs, "1,x,3"), string(lineBody), wire.HeaderTokenIDs},
		{"bad action", with(lineH, wire.HeaderTokenIDs, "1"), "3,a@x,a," + tok + ",01234", "token 0 action"},
		{"empty email", with(lineH, wire.HeaderTokenIDs, "1"), "1,,a," + tok + ",01234", "token 0 email"},
		{"empty login", with(lineH, wire.HeaderTokenIDs, "1"), "1,a@x,," + tok + ",01234", "token 0 login"},
		{"short token", with(lineH, wire.HeaderTokenIDs, "1"), "1,a@x,a," + tok[:85] + ",01234", "token 0 token"},
		{"bad token alphabet", with(lineH, wire.HeaderTokenIDs, "1"), "1,a@x,a," + tok[:85] + "+,01234", "token 0 token"},
		{"recovery code", with(lineH, wire.HeaderTokenIDs, "1"), "2,a@x,a," + tok + ",123", "token 0 code"},
		{"count header", with(lineH, wire.HeaderCount, "5"), string(lineBody), wire.HeaderCount},
		{"unknown format", with(lineH, wire.HeaderFormat, "xml"), string(lineBody), wire.HeaderFormat},
		{"json garbage", jsonH, "{", "body"},
		{"json no batch", jsonH, `{"tokens":[]}`, "batch"},
		{"json no tokens", jsonH, `{"batch":"x"}`, "tokens"},
		{"json no id", jsonH, `{"batch":"x","tokens":[{"action":"activation","email":"a","login":"a","token":"` + tok + `"}]}`, "token 0 id"},
		{"json bad action", jsonH, `{"batch":"x","tokens":[{"id":1,"action":"x","email":"a","login":"a","token":"` + tok + `"}]}`, "token 0 action"},
		{"json count", with(jsonH, wire.HeaderCount, "1"), string(jsonBody), wire.HeaderCount},
		{"key count", with(lineH, wire.HeaderTokenKeys, "a,b"), string(lineBody), wire.HeaderTokenKeys},
		{"key mismatch", with(lineH, wire.HeaderTokenKeys, "a,b,c"), string(lineBody), wire.HeaderTokenKeys},
		{"json key mismatch", with(jsonH, wire.HeaderTokenKeys, ""), `{"batch":"x","tokens":[{"id":1,"action":"activation","email":"a","login":"a","token":"` + tok + `","key":"AAAAAAAAAAAAAAAAAAAAAA"}]}`, "token 0 key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := subscriber.Decode(tc.h, []byte(tc.body))
			var ce *subscriber.Error
			if !errors.As(err, &ce) {
				t.Fatalf("err = %v, want *subscriber.Error", err)
			}
			if ce.Field != tc.field || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error %q names field %q, want %q", err, ce.Field, tc.field)
			}
		})
	}
}

func TestDedupWindow(t *testing.T) {
	d := subscriber.NewDedup[int64](3)
	for _, id := range []int64{1, 2, 3} {
		if d.Seen(id) {
			t.Fatalf("%d seen before", id)
		}
	}
	if !d.Seen(2) || !d.Contains(1) {
		t.Fatal("window forgot a key too early")
	}
	d.Seen(4) // evicts 1
	if d.Contains(1) || !d.Contains(4) || !d.Contains(2) || !d.Contains(3) {
		t.Fatal("window did not evict the oldest key")
	}
	if d.Seen(1) {
		t.Fatal("an evicted key is reported seen")
	}
}

// A consumer's loop body: decode a message, send each token once, then
// acknowledge (docs/consumers.md, "In Go"). Compiled, not run: it
// needs a stream.
func Example_decodeAndDedup() {
	send := func(email, login, tok, code string) {}
	dedup := subscriber.NewDedup[string](100_000)
	handle := func(msg jetstream.Msg) {
		batch, err := subscriber.Decode(msg.Headers(), msg.Data())
		if err != nil {
			// Log it with the field it names, and set the message aside.
			msg.Term()
			return
		}
		for _, t := range batch.Tokens {
			if dedup.Seen(t.Key) {
				continue // redelivered: already handled
			}
			send(t.Email, t.Login, t.Token, t.Code)
		}
		msg.Ack()
	}
	_ = handle
}

// Trace headers that do not agree with the message are passed over: the
// batch decodes, and no token gets a trace.
func TestDecodeTraceHeaders(t *testing.T) {
	const (
		a = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		b = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
	)
	for _, tc := range []struct {
		name           string
		traces, tokens []string
		want           []string
	}{
		{"none", nil, nil, []string{"", "", ""}},
		{"two", []string{a, b}, []string{"0,2", "1"}, []string{a, b, a}},
		{"one token untraced", []string{b}, []string{"1-2"}, []string{"", b, b}},
		{"counts differ", []string{a, b}, []string{"0"}, []string{"", "", ""}},
		{"not a traceparent", []string{a, "00-xyz"}, []string{"0", "1"}, []string{"", "", ""}},
		{"past the tokens", []string{a}, []string{"0-3"}, []string{"", "", ""}},
		{"a token twice", []string{a, b}, []string{"0-1", "1"}, []string{"", "", ""}},
		{"garbage", []string{a}, []string{"0,,x"}, []string{"", "", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, body, _, _ := encoded(t, wire.FormatLine)
			if tc.traces != nil {
				h[wire.HeaderTraceparent], h[wire.HeaderTraceTokens] = tc.traces, tc.tokens
			}
			batch, err := subscriber.Decode(h, body)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, tok := range batch.Tokens {
				got = append(got, tok.Traceparent)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("traces %q, want %q", got, tc.want)
			}
		})
	}
}
