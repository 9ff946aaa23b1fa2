package natsconn

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/internal/embedded"
)

// Mode says what a command does with the embedded server when
// MAILROOM_NATS_URL is unset.
type Mode int

const (
	// Own runs the embedded server on MAILROOM_DATA_DIR, and refuses a
	// data directory another tailer holds (tailer run).
	Own Mode = iota
	// Share uses the embedded server of the tailer that holds
	// MAILROOM_DATA_DIR, or runs one (tailer resync beside tailer run, as
	// the runbooks say).
	Share
)

// Connect connects to MAILROOM_NATS_URL, or to the embedded server (on
// MAILROOM_DATA_DIR) when it is unset, as mode says. store is the embedded
// server's store when this process started it (nil otherwise); shutdown
// closes the connection and stops that server.
func Connect(cfg *config.Config, log *slog.Logger, mode Mode, opts ...nats.Option) (nc *nats.Conn, store *embedded.Store, shutdown func(), err error) {
	natsURL := cfg.NATSURL
	stop := func() {}
	if natsURL == "" {
		if url, ok := embedded.Running(cfg.DataDir); ok && mode == Share {
			natsURL = url
			log.Info("using the embedded NATS server of the tailer running on MAILROOM_DATA_DIR", "url", url, "data_dir", cfg.DataDir)
		} else if store, stop, err = startEmbedded(cfg, log); err != nil {
			return nil, nil, nil, err
		} else {
			natsURL = store.Server().ClientURL()
		}
	}
	all := []nats.Option{nats.Timeout(5 * time.Second)}
	if cfg.NATSURL != "" {
		all = append(all, cfg.NATSOptions()...)
	}
	nc, err = nats.Connect(natsURL, append(all, opts...)...)
	if err != nil {
		stop()
		if cfg.NATSURL != "" {
			// Only a configured URL (or its credentials) can be wrong; the
			// tailer gives up at startup so that a typo does not look like
			// an outage.
			return nil, nil, nil, &config.Error{Var: "MAILROOM_NATS_URL", Err: fmt.Errorf("cannot connect to %s: %w", config.RedactURL(cfg.NATSURL), err)}
		}
		return nil, nil, nil, fmt.Errorf("connect to NATS: %w", err)
	}
	return nc, store, func() { nc.Close(); stop() }, nil
}

// startEmbedded claims MAILROOM_DATA_DIR, checks that MAILROOM_NATS_LISTEN
// is free (a port in use is said at once, not after the server's wait for
// readiness), starts the server and says where it listens in the claim.
func startEmbedded(cfg *config.Config, log *slog.Logger) (*embedded.Store, func(), error) {
	claim, err := embedded.ClaimDir(cfg.DataDir)
	var inUse *embedded.InUseError
	if errors.As(err, &inUse) {
		return nil, nil, &config.Error{Var: "MAILROOM_DATA_DIR", Err: fmt.Errorf("%w; stop that one, or give this one a directory of its own", err)}
	}
	if err != nil {
		return nil, nil, &config.Error{Var: "MAILROOM_DATA_DIR", Err: err}
	}
	ln, err := net.Listen("tcp", cfg.NATSListen)
	if err != nil {
		claim.Release()
		return nil, nil, &config.Error{Var: "MAILROOM_NATS_LISTEN", Err: fmt.Errorf("%s cannot be listened on (%v): set a free address, or MAILROOM_NATS_URL to a running server", cfg.NATSListen, err)}
	}
	ln.Close()
	store, err := embedded.StartStore(cfg.DataDir, cfg.NATSListen, embedded.SyncInterval(cfg.NATSSync))
	if err != nil {
		claim.Release()
		return nil, nil, err
	}
	srv := store.Server()
	url := srv.ClientURL()
	if err := claim.Announce(url); err != nil {
		log.Warn("cannot say in the data directory where the embedded server listens: tailer status, subscribe and resync will not find it", "data_dir", cfg.DataDir, "err", err)
	}
	log.Info("embedded NATS JetStream started", "url", url, "store", cfg.DataDir)
	return store, func() { srv.Shutdown(); srv.WaitForShutdown(); claim.Release() }, nil
}

// Source names the setting URL took its address from, for an error that
// cannot connect there: MAILROOM_NATS_URL; or, unset, the data
// directory's tailer run or MAILROOM_NATS_LISTEN, with the way to name
// the servers.
func Source(cfg *config.Config) string {
	switch {
	case cfg.NATSURL != "":
		return "MAILROOM_NATS_URL"
	case func() bool { _, ok := embedded.Running(cfg.DataDir); return ok }():
		return "MAILROOM_NATS_URL unset: the embedded server of the tailer run on MAILROOM_DATA_DIR"
	}
	return "MAILROOM_NATS_URL unset: no tailer run on MAILROOM_DATA_DIR says where its embedded server listens, so MAILROOM_NATS_LISTEN; set MAILROOM_NATS_URL to your NATS servers"
}

// URL is where a command that only connects (status, subscribe,
// dead-letters) finds NATS: MAILROOM_NATS_URL; else the embedded server of
// the tailer running on MAILROOM_DATA_DIR; else MAILROOM_NATS_LISTEN, where
// one would listen.
func URL(cfg *config.Config) string {
	if cfg.NATSURL != "" {
		return cfg.NATSURL
	}
	if url, ok := embedded.Running(cfg.DataDir); ok {
		return url
	}
	return "nats://" + cfg.NATSListen
}
