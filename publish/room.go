package publish

import (
	"errors"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// JetStream's error codes for a server without room: insufficient
// resources (a store reservation, or usage past max_file_store), and
// storage or memory resources exceeded (the account's limits).
const (
	jsInsufficientResources = 10023
	jsMemoryExceeded        = 10028
	jsStorageExceeded       = 10047
)

// NoRoom reports whether err is the stream's server refusing a message,
// or the stream, for want of room: JetStream's limits reached, its store's
// disk full, or JetStream shut down (a server whose disk filled does so).
// It passes when the server has room again, without the tailer doing
// anything but trying again.
func NoRoom(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jsInsufficientResources, jsMemoryExceeded, jsStorageExceeded,
			jetstream.JSErrCodeJetStreamNotEnabled, jetstream.JSErrCodeJetStreamNotEnabledForAccount:
			return true
		}
	}
	return errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) ||
		err != nil && (strings.Contains(err.Error(), "no space left on device") || strings.Contains(err.Error(), "insufficient resources"))
}
