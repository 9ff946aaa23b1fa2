// Package embedded runs an in-process NATS server with JetStream, the
// tailer's default when no NATS URL is configured.
package embedded

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Start runs a JetStream-enabled NATS server storing under dir and listening
// on listen (host:port; port 0 picks a free one). Other clients can connect
// to its ClientURL.
func Start(dir, listen string) (*server.Server, error) {
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
	s, err := server.NewServer(&server.Options{
		ServerName: "tailer-embedded",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   dir,
		NoSigs:     true,
		NoLog:      true,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	s.Start()
	if !s.ReadyForConnections(15 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded NATS on %s did not become ready", listen)
	}
	return s, nil
}
