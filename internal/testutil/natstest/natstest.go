package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/embedded"
)

// JetStream starts an embedded nats-server with JetStream for tb, in a
// directory of its own, and connects to it; both end with tb.
func JetStream(tb testing.TB) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	srv, err := embedded.Start(tb.TempDir(), "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	return nc, js
}

// Server starts a nats-server with opts for tb (quiet, no signal
// handlers), and waits until it takes connections; it stops with tb.
func Server(tb testing.TB, opts *server.Options) *server.Server {
	tb.Helper()
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		tb.Fatal(err)
	}
	s.Start()
	tb.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		tb.Fatal("NATS server not ready")
	}
	return s
}
