// Package newaction_test adds a token action to action.Actions, in this test
// binary alone, and runs tokens of it through the tailer to a subscriber:
// a new action is a row of that table and a value of the database's
// token_action type, and nothing else (issue 48).
package newaction_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/cmd/internal/daemon"
	"github.com/mailroom/tailer/decoder/action"
	"github.com/mailroom/tailer/internal/embedded"
	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
	"github.com/mailroom/tailer/migrations/migratetest"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire/wiretest"
	"github.com/mailroom/tailer/replication"
)

// magicLink is the action this test adds: a sign-in link, its own signed
// prefix, no code, for active accounts.
var magicLink = action.Spec{Label: "magic_link", Prefix: "/magic", Status: "active"}

func TestMain(m *testing.M) {
	action.Actions = append(action.Actions, magicLink)
	os.Exit(pgtest.Main(m))
}

const keyHex = "cafebabecafebabecafebabecafebabecafebabecafebabecafebabecafebabe"

// A token of the added action is decoded, put in a lane and on a subject
// of its own, status-checked, signed with its prefix, numbered 3 in its
// line, and read back by a subscriber as that action; one whose account
// has another status is skipped; the actions before it go on as they
// did.
func TestANewActionEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := migratetest.NewDB(t, pgtest.Shared(t))
	db.Exec(`ALTER TYPE token_action ADD VALUE 'magic_link'`)
	if _, err := replication.CreateSlot(ctx, replication.SchemaConn{Querier: db.Conn, Schema: "public"}, "mailroom", "tailer migrate", false, false); err != nil {
		t.Fatal(err)
	}
	srv, err := embedded.Start(t.TempDir(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	env := map[string]string{
		"MAILROOM_DATABASE_URL": db.URL, "MAILROOM_SECRET_KEY": keyHex, "MAILROOM_NATS_URL": srv.ClientURL(),
		"MAILROOM_BATCH_LIMIT": "10", "MAILROOM_BATCH_TIMEOUT": "100", "MAILROOM_SUBJECT_PER_ACTION": "true",
	}
	cfg, err := config.Load(config.For(config.Run), []string{"--http-addr="}, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	d := daemon.New(cfg, daemon.NewLogger("text", "info", &tailertest.Buffer{TB: t}))
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("tailer exited: %v", err)
	}

	db.Exec(`INSERT INTO accounts (email, login, status) VALUES ('a@x', 'a', 'active'), ('p@x', 'p', 'provisioned')`)
	db.Exec(`INSERT INTO tokens (account, action) SELECT id, 'magic_link' FROM accounts WHERE login IN ('a', 'p')`)
	db.Exec(`INSERT INTO tokens (account, action) SELECT id, 'password_recovery' FROM accounts WHERE login = 'a'`)
	var magicID, skippedID int64
	var secret []byte
	if err := db.Conn.QueryRow(ctx, `SELECT t.id, t.secret FROM tokens t JOIN accounts a ON a.id = t.account WHERE t.action = 'magic_link' AND a.login = 'a'`).Scan(&magicID, &secret); err != nil {
		t.Fatal(err)
	}
	if err := db.Conn.QueryRow(ctx, `SELECT t.id FROM tokens t JOIN accounts a ON a.id = t.account WHERE t.action = 'magic_link' AND a.login = 'p'`).Scan(&skippedID); err != nil {
		t.Fatal(err)
	}

	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	// The lane's subject, from a subscriber of that action alone.
	var out bytes.Buffer
	tailertest.Eventually(t, time.Minute, func() error {
		out.Reset()
		sub, err := subscriber.NewSubscriber(subscriber.Config{Stream: cfg.Stream, Subject: cfg.Subject, Durable: fmt.Sprintf("magic%d", time.Now().UnixNano()),
			FromStart: true, UntilDrained: true, Action: "magic_link", Sink: &subscriber.Lines{Out: &out}})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		if err := sub.Run(ctx, js); err != nil {
			return err
		}
		if out.Len() == 0 {
			return fmt.Errorf("no magic_link line yet")
		}
		return nil
	})
	key, _ := hex.DecodeString(keyHex)
	mac := hmac.New(sha256.New, key)
	mac.Write(append([]byte("/magic"), secret...))
	want := base64.RawURLEncoding.EncodeToString(append(secret, mac.Sum(nil)...))
	line := strings.TrimSuffix(out.String(), "\n")
	f := strings.Split(line, ",")
	if len(f) != 5 || f[0] != "3" || f[1] != "a@x" || f[3] != want {
		t.Fatalf("the subscriber wrote %q; want one token, numbered 3, for a@x, signed /magic ‖ secret (%s)", line, want)
	}
	toks, err := subscriber.DecodeLine(line)
	if err != nil || toks[0].Action != "magic_link" {
		t.Fatalf("DecodeLine(%q) = %+v, %v", line, toks, err)
	}
	ring, _ := token.SingleKey(key)
	if _, _, err := ring.Verify(f[3], 3, ""); err != nil {
		t.Fatalf("the ring does not verify the magic_link token: %v", err)
	}
	// On its lane's subject, with the skipped one and the others counted.
	msgs, err := (&wiretest.StreamCache{}).Messages(ctx, mustStream(ctx, t, js, cfg.Stream))
	if err != nil {
		t.Fatal(err)
	}
	subjects := map[string]bool{}
	for _, m := range msgs {
		ids, _ := wiretest.TokenIDs(m)
		for _, id := range ids {
			if id == skippedID {
				t.Fatalf("token %d of a provisioned account published as magic_link", id)
			}
			if id == magicID {
				subjects[m.Subject] = true
			}
		}
	}
	if !subjects[cfg.Subject+".magic_link"] || len(subjects) != 1 {
		t.Fatalf("the magic_link token was published on %v, want %s.magic_link", subjects, cfg.Subject)
	}
}

func mustStream(ctx context.Context, t *testing.T, js jetstream.JetStream, name string) jetstream.Stream {
	t.Helper()
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
