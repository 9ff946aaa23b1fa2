package natsconn

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/internal/embedded"
)

// Connect connects to MAILROOM_NATS_URL, or starts the embedded server
// (on MAILROOM_DATA_DIR) when it is unset. shutdown closes the connection
// and stops the embedded server.
func Connect(cfg *config.Config, log *slog.Logger, opts ...nats.Option) (nc *nats.Conn, shutdown func(), err error) {
	natsURL := cfg.NATSURL
	stop := func() {}
	if natsURL == "" {
		srv, err := embedded.Start(cfg.DataDir, cfg.NATSListen, embedded.SyncInterval(cfg.NATSSync))
		if err != nil {
			return nil, nil, err
		}
		stop = srv.Shutdown
		natsURL = srv.ClientURL()
		log.Info("embedded NATS JetStream started", "url", natsURL, "store", cfg.DataDir)
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
			return nil, nil, &config.Error{Var: "MAILROOM_NATS_URL", Err: fmt.Errorf("cannot connect to %s: %w", config.RedactURL(cfg.NATSURL), err)}
		}
		return nil, nil, fmt.Errorf("connect to NATS: %w", err)
	}
	return nc, func() { nc.Close(); stop() }, nil
}
