package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/mailroom/tailer/internal/testutil/certtest"
	"github.com/mailroom/tailer/internal/testutil/pgtest"
)

// startNATSWith runs a NATS server with opts (plus JetStream on a
// temporary store) on the cluster's port; the cluster's own checks then
// connect with natsOpts.
func (c *cluster) startNATSWith(opts *server.Options, natsOpts ...nats.Option) {
	c.t.Helper()
	c.stopNATS()
	opts.Host, opts.Port = "127.0.0.1", c.natsPort
	opts.JetStream, opts.StoreDir, opts.NoSigs, opts.NoLog = true, c.t.TempDir(), true, true
	s, err := server.NewServer(opts)
	if err != nil {
		c.t.Fatal(err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		c.t.Fatal("NATS not ready")
	}
	c.nats, c.natsOpts = s, natsOpts
}

// Each way of authenticating to NATS, over TLS with a client certificate
// too: the tailer streams and publishes with the right credential, and a
// wrong one is one line at startup (exit 2) that shows no secret.
func TestNATSAuthentication(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certs := certtest.Write(t, dir, "nats")
	other := certtest.Write(t, dir, "other")
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := user.Seed()
	pub, _ := user.PublicKey()
	seedFile := filepath.Join(dir, "user.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	otherUser, _ := nkeys.CreateUser()
	otherSeed, _ := otherUser.Seed()
	otherSeedFile := filepath.Join(dir, "other.nk")
	os.WriteFile(otherSeedFile, otherSeed, 0o600)

	tlsConfig, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: certs.ServerCert, KeyFile: certs.ServerKey, CaFile: certs.CA, Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		server    server.Options
		conn      []nats.Option
		good, bad []string
		secret    string
	}{
		{
			name:   "user and password over TLS with a client certificate",
			server: server.Options{Username: "tailer", Password: "right-pw", TLS: true, TLSVerify: true, TLSConfig: tlsConfig},
			conn:   []nats.Option{nats.UserInfo("tailer", "right-pw"), nats.RootCAs(certs.CA), nats.ClientCert(certs.ClientCert, certs.ClientKey)},
			good: []string{"MAILROOM_NATS_USER=tailer", "MAILROOM_NATS_PASSWORD=right-pw",
				"MAILROOM_NATS_TLS_CA=" + certs.CA, "MAILROOM_NATS_TLS_CERT=" + certs.ClientCert, "MAILROOM_NATS_TLS_KEY=" + certs.ClientKey},
			bad: []string{"MAILROOM_NATS_USER=tailer", "MAILROOM_NATS_PASSWORD=wrong-secret-pw",
				"MAILROOM_NATS_TLS_CA=" + certs.CA, "MAILROOM_NATS_TLS_CERT=" + certs.ClientCert, "MAILROOM_NATS_TLS_KEY=" + certs.ClientKey},
			secret: "wrong-secret-pw",
		},
		{
			name:   "TLS with a client certificate of another CA",
			server: server.Options{TLS: true, TLSVerify: true, TLSConfig: tlsConfig},
			conn:   []nats.Option{nats.RootCAs(certs.CA), nats.ClientCert(certs.ClientCert, certs.ClientKey)},
			good:   []string{"MAILROOM_NATS_TLS_CA=" + certs.CA, "MAILROOM_NATS_TLS_CERT=" + certs.ClientCert, "MAILROOM_NATS_TLS_KEY=" + certs.ClientKey},
			bad:    []string{"MAILROOM_NATS_TLS_CA=" + certs.CA, "MAILROOM_NATS_TLS_CERT=" + other.ClientCert, "MAILROOM_NATS_TLS_KEY=" + other.ClientKey},
		},
		{
			name:   "nkey",
			server: server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}},
			conn:   []nats.Option{nkeyOption(t, seedFile)},
			good:   []string{"MAILROOM_NATS_NKEY=" + seedFile},
			bad:    []string{"MAILROOM_NATS_NKEY=" + otherSeedFile},
			secret: string(otherSeed),
		},
		{
			name:   "token",
			server: server.Options{Authorization: "right-token"},
			conn:   []nats.Option{nats.Token("right-token")},
			good:   []string{"MAILROOM_NATS_TOKEN=right-token"},
			bad:    []string{"MAILROOM_NATS_TOKEN=wrong-secret-token"},
			secret: "wrong-secret-token",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, pgtest.Shared(t), 10, 100*time.Millisecond)
			c.startNATSWith(&tc.server, tc.conn...)
			p := c.tailer(tc.bad...)
			code := p.exit(30 * time.Second)
			out := p.out.String()
			if code != exitConfig || strings.Count(out, "\n") != 1 || !strings.Contains(out, "MAILROOM_NATS_URL") || (tc.secret != "" && strings.Contains(out, tc.secret)) {
				t.Fatalf("wrong credential: exit %d, want %d and one line naming MAILROOM_NATS_URL without the secret:\n%s", code, exitConfig, out)
			}
			p = c.tailer(tc.good...)
			p.waitLog("msg=streaming", 1, 30*time.Second)
			c.Exec(`INSERT INTO accounts (email, login) SELECT 'auth' || g || '@x', 'auth' || g FROM generate_series(1, 5) g`)
			if n := c.expectExactlyOnce(30 * time.Second); n != 5 {
				t.Fatalf("%d tokens", n)
			}
		})
	}
}

func nkeyOption(t *testing.T, seedFile string) nats.Option {
	opt, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	return opt
}

// PostgreSQL over TLS with sslmode=verify-full against a server whose
// certificate a test CA signed: the tailer's replication and query
// connections are both encrypted, and a certificate of another CA is one
// line at startup.
func TestPostgresVerifyFull(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certs := certtest.Write(t, dir, "pg")
	other := certtest.Write(t, dir, "other")
	pg, err := pgtest.Start(pgtest.Options{TLSCert: certs.ServerCert, TLSKey: certs.ServerKey})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	c := newCluster(t, pg, 10, 100*time.Millisecond)
	verify := func(ca string) string {
		return strings.Replace(c.URL, "sslmode=disable", "sslmode=verify-full&sslrootcert="+ca, 1)
	}

	p := c.tailer("MAILROOM_DATABASE_URL=" + verify(other.CA))
	if code := p.exit(30 * time.Second); code != exitConfig || strings.Count(p.out.String(), "\n") != 1 || !strings.Contains(p.out.String(), "TLS certificate is not accepted") {
		t.Fatalf("a server certificate of another CA: exit %d:\n%s", code, p.out.String())
	}

	p = c.tailer("MAILROOM_DATABASE_URL=" + verify(certs.CA))
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'tls' || g || '@x', 'tls' || g FROM generate_series(1, 5) g`)
	if n := c.expectExactlyOnce(30 * time.Second); n != 5 {
		t.Fatalf("%d tokens", n)
	}
	var plain, encrypted int
	if err := c.Conn.QueryRow(c.ctx, `
		SELECT count(*) FILTER (WHERE NOT s.ssl), count(*) FILTER (WHERE s.ssl)
		FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
		WHERE a.application_name = 'tailer'`).Scan(&plain, &encrypted); err != nil {
		t.Fatal(err)
	}
	// The query connection, the walsender and the lag sampler.
	if plain != 0 || encrypted < 2 {
		t.Fatalf("tailer connections: %d plain, %d over TLS", plain, encrypted)
	}
}
