package subscriber_test

import (
	"bytes"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire"
)

// FuzzDecode decodes arbitrary headers and bodies in both formats. It must
// not panic; what it accepts must be valid tokens, and must encode back to
// the same body (line) or to a body that decodes to the same tokens (json).
func FuzzDecode(f *testing.F) {
	for _, format := range []wire.Format{wire.FormatLine, wire.FormatJSON} {
		h, body, _, _ := encoded(f, format)
		f.Add(h.Get(wire.HeaderFormat), h.Get(wire.HeaderTokenIDs), h.Get(wire.HeaderTokenKeys), h.Get(wire.HeaderCount), h.Get(wire.HeaderBatchSizes), body)
	}
	f.Add("line", "1", "", "1", "", []byte("1,a,b,c,d"))
	f.Add("line", "1,2", "", "2", "1,1", []byte("1,a,b,c,d\n1,a,b,c,d"))
	f.Add("json", "", "", "", "", []byte(`{"batch":"x","tokens":[{"id":1}],"batch_sizes":[1]}`))
	f.Add("xml", "", "", "", "", []byte{})
	f.Fuzz(func(t *testing.T, format, ids, keys, count, sizes string, body []byte) {
		h := nats.Header{}
		for k, v := range map[string]string{wire.HeaderFormat: format, wire.HeaderTokenIDs: ids, wire.HeaderTokenKeys: keys, wire.HeaderCount: count, wire.HeaderBatchSizes: sizes} {
			if v != "" {
				h.Set(k, v)
			}
		}
		b, err := subscriber.Decode(h, body)
		if err != nil {
			return
		}
		if len(b.Tokens) == 0 {
			t.Fatal("accepted a batch without tokens")
		}
		for i, tok := range b.Tokens {
			if key, err := token.KeyOf(tok.Token); err != nil || key != tok.Key {
				t.Fatalf("token %d: key %q, from its token %q (%v)", i, tok.Key, key, err)
			}
		}
		total := 0
		for _, n := range b.Sizes {
			if n <= 0 {
				t.Fatalf("accepted a batch of %d tokens", n)
			}
			total += n
		}
		if total != len(b.Tokens) {
			t.Fatalf("sizes %v for %d tokens", b.Sizes, len(b.Tokens))
		}
		if format == "" || format == "line" {
			var again []byte
			for i, line := range b.Lines() {
				if i > 0 {
					again = append(again, '\n')
				}
				again = subscriber.AppendLine(again, line)
			}
			if !bytes.Equal(again, body) {
				t.Fatalf("line %q encodes back to %q", body, again)
			}
			return
		}
		again, err := subscriber.AppendJSON(nil, b.ID, b.Tokens)
		if err != nil {
			t.Fatal(err)
		}
		b2, err := subscriber.Decode(nats.Header{wire.HeaderFormat: {"json"}}, again)
		if err != nil || len(b2.Tokens) != len(b.Tokens) || b2.ID != b.ID {
			t.Fatalf("json re-encoded as %s does not decode back: %v", again, err)
		}
		for i := range b.Tokens {
			if b2.Tokens[i] != b.Tokens[i] {
				t.Fatalf("token %d: %+v, after a round trip %+v", i, b.Tokens[i], b2.Tokens[i])
			}
		}
	})
}
