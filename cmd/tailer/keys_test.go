package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mailroom/tailer/decoder/action"
	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire"
	"github.com/mailroom/tailer/publish/wire/wiretest"
)

// The rotation runbook of docs/operations.md, twice, under a writer: add
// the new key, make it primary, retire the old one, the tailer restarted
// each time. Every token is on the stream once; each message is signed by
// the primary key of its tailer's ring, and names it; each token verifies against every ring that holds its
// key and none other (once its key is retired it no longer verifies); and
// a resync after the rotations signs with the primary key and keeps every
// token's key.
func TestKeyRotation(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	keys := map[string]string{}
	for _, id := range []string{"a", "b", "c"} {
		b := make([]byte, token.KeySize)
		rand.Read(b)
		keys[id] = hex.EncodeToString(b)
	}
	ring := func(spec string) string {
		var b strings.Builder
		for _, f := range strings.Fields(spec) {
			id, primary := strings.CutSuffix(f, "*")
			fmt.Fprintf(&b, "%s %s", id, keys[id])
			if primary {
				b.WriteString(" primary")
			}
			b.WriteString("\n")
		}
		return b.String()
	}
	steps := []string{"a*", "a* b", "a b*", "b*", "b* c", "b c*", "c*"}
	path := filepath.Join(t.TempDir(), "keyring")
	env := []string{"MAILROOM_SECRET_KEY=", "MAILROOM_KEYRING_FILE=" + path}
	rings := make([]*token.Ring, len(steps))

	w := c.startWriter(2, 10*time.Millisecond)
	var p *proc
	// from[i] is the stream's last sequence before step i's tailer: it
	// publishes after it, and before from[i+1].
	from := make([]uint64, len(steps)+1)
	for i, spec := range steps {
		if err := os.WriteFile(path, []byte(ring(spec)), 0o600); err != nil {
			t.Fatal(err)
		}
		var err error
		if rings[i], err = token.ParseRing([]byte(ring(spec))); err != nil {
			t.Fatal(err)
		}
		if p != nil {
			if code := p.term(30 * time.Second); code != exitOK {
				t.Fatalf("step %d: SIGTERM: exit %d:\n%s", i, code, p.out.String())
			}
		}
		from[i] = c.lastSeq()
		p = c.tailer(env...)
		p.waitLog("msg=streaming", 1, 30*time.Second)
		// The keys in use, on the streaming line (and in tailer_signing_key).
		p.waitLog(fmt.Sprintf(`signing_key=%s key_ids=%s`, rings[i].PrimaryID(), strings.Join(rings[i].IDs(), ",")), 1, 5*time.Second)
		before := c.streamMsgs()
		tailertest.Eventually(t, 30*time.Second, func() error {
			if c.streamMsgs() < before+3 {
				return fmt.Errorf("step %d (%s): %d batches on the stream, %d before", i, spec, c.streamMsgs(), before)
			}
			return nil
		})
	}
	w.halt()
	if w.err != nil {
		t.Fatal(w.err)
	}
	c.expectExactlyOnce(30 * time.Second)
	from[len(steps)] = c.lastSeq()

	signedBy := map[string]int{}
	for _, m := range c.messages() {
		b, err := subscriber.Decode(m.Header, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if b.KeyID == "" || b.KeyID != m.Header.Get(wire.HeaderKeyID) {
			t.Fatalf("message %d names key %q (header %q)", m.Sequence, b.KeyID, m.Header.Get(wire.HeaderKeyID))
		}
		signedBy[b.KeyID] += len(b.Tokens)
		for i := range steps {
			if m.Sequence > from[i] && m.Sequence <= from[i+1] && b.KeyID != rings[i].PrimaryID() {
				t.Fatalf("message %d, published with ring %q, signed with key %s", m.Sequence, steps[i], b.KeyID)
			}
		}
		for _, tok := range b.Tokens {
			act := action.Activation
			if tok.Action == "password_recovery" {
				act = action.PasswordRecovery
			}
			for i, r := range rings {
				id, _, err := r.Verify(tok.Token, act, tok.Code)
				holds := strings.Contains(" "+steps[i]+" ", " "+b.KeyID+" ") || strings.Contains(" "+steps[i]+" ", " "+b.KeyID+"* ")
				switch {
				case holds && (err != nil || id != b.KeyID):
					t.Fatalf("token %d of key %s against ring %q: %s, %v", tok.ID, b.KeyID, steps[i], id, err)
				case !holds && err == nil:
					t.Fatalf("token %d of key %s verifies against ring %q, which retired it", tok.ID, b.KeyID, steps[i])
				}
			}
		}
	}
	for _, id := range []string{"a", "b", "c"} {
		if signedBy[id] == 0 {
			t.Fatalf("no token signed with key %s: %v", id, signedBy)
		}
	}
	t.Logf("tokens signed by key: %v", signedBy)

	// tailer verify with the last ring: a token of c is valid and named, one
	// of a is not.
	var ofA, ofC subscriber.SignedToken
	for _, m := range c.messages() {
		b, _ := subscriber.Decode(m.Header, m.Data)
		for _, tok := range b.Tokens {
			switch b.KeyID {
			case "a":
				ofA = tok
			case "c":
				ofC = tok
			}
		}
	}
	if v := c.command([]string{"verify", ofC.Token}, env...); v.exit(10*time.Second) != exitOK || !strings.Contains(v.out.String(), "signed with key c") {
		t.Fatalf("tailer verify of a token of the primary key:\n%s", v.out.String())
	}
	if v := c.command([]string{"verify", ofA.Token}, env...); v.exit(10*time.Second) != exitFailure {
		t.Fatalf("tailer verify of a token of a retired key:\n%s", v.out.String())
	}

	// A resync after the rotations, into a stream of its own: every token
	// again, signed with c, under the keys it had.
	keyOf := map[int64]string{}
	for _, m := range c.messages() {
		ids, _ := wiretest.TokenIDs(m)
		for i, k := range wiretest.TokenKeys(m) {
			keyOf[ids[i]] = k
		}
	}
	p.term(30 * time.Second)
	r := c.command([]string{"resync"}, append(env, "MAILROOM_NATS_STREAM=AGAIN", "MAILROOM_NATS_SUBJECT=again.batches")...)
	if code := r.exit(60 * time.Second); code != exitOK {
		t.Fatalf("resync: exit %d:\n%s", code, r.out.String())
	}
	c.streamName = "AGAIN"
	again := c.messages()
	n := 0
	for _, m := range again {
		if m.Header.Get(wire.HeaderKeyID) != "c" {
			t.Fatalf("resynced message %d names key %q, want c", m.Sequence, m.Header.Get(wire.HeaderKeyID))
		}
		ids, _ := wiretest.TokenIDs(m)
		for i, k := range wiretest.TokenKeys(m) {
			if keyOf[ids[i]] != k {
				t.Fatalf("token %d resynced under key %s, published before under %s", ids[i], k, keyOf[ids[i]])
			}
			n++
		}
	}
	if n != len(keyOf) {
		t.Fatalf("the resync published %d tokens, want the %d eligible", n, len(keyOf))
	}
}
