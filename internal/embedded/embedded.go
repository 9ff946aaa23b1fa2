package embedded

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Option changes the embedded server's settings.
type Option func(*server.Options)

// SyncInterval makes the server fsync its store every d instead of before
// every acknowledgement: more throughput of small messages, but a host
// crash loses up to d of acknowledged batches, whose positions the slot
// may already have been confirmed past. d <= 0 keeps the default.
func SyncInterval(d time.Duration) Option {
	return func(o *server.Options) {
		if d > 0 {
			o.SyncAlways, o.SyncInterval = false, d
		}
	}
}

// maxStore is no limit at all: a pebibyte.
const maxStore = 1 << 50

// Start runs a JetStream-enabled NATS server storing under dir and listening
// on listen (host:port; port 0 picks a free one). Other clients can connect
// to its ClientURL. By default the store is synced to disk before every
// acknowledgement.
func Start(dir, listen string, opts ...Option) (*server.Server, error) {
	st, err := StartStore(dir, listen, opts...)
	if err != nil {
		return nil, err
	}
	return st.srv, nil
}

// StartStore is Start, returning the server's Store: what keeps it from
// taking messages, and JetStream turned on again once the disk has room.
func StartStore(dir, listen string, opts ...Option) (*Store, error) {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS listen address %q: %w", listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS listen port %q: %w", portStr, err)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	o := &server.Options{
		ServerName: "tailer-embedded",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   dir,
		// The tailer confirms the slot once a batch's PubAck is in; on one
		// server (no replicas) the ack must mean the batch is on disk, or a
		// host crash loses what the slot no longer holds. The server's
		// default syncs every two minutes.
		SyncAlways: true,
		// The store's limit is its filesystem's: left unset, the server
		// takes three quarters of the space free at its start as its
		// limit for good, and a store started on a nearly full disk
		// refuses every message ("insufficient resources") after the
		// disk is grown too (issue 62).
		JetStreamMaxStore: maxStore,
		NoSigs:            true,
		NoLog:             true,
	}
	for _, opt := range opts {
		opt(o)
	}
	s, err := server.NewServer(o)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	s.Start()
	if !s.ReadyForConnections(15 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded NATS on %s did not become ready", listen)
	}
	return &Store{srv: s, dir: dir, js: server.JetStreamConfig{
		StoreDir: o.StoreDir, SyncInterval: o.SyncInterval, SyncAlways: o.SyncAlways,
		MaxStore: o.JetStreamMaxStore, Strict: !o.NoJetStreamStrict, CompressOK: true,
	}}, nil
}
