package jsio

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
	// jsAccountResources: the account's JetStream limits (its
	// max_storage) reached; jsStoreFailed carries why a store failed, a
	// stream's discard new limit among the reasons (Full).
	jsAccountResources = 10002
	jsStoreFailed      = 10077
)

// fullReasons are jsStoreFailed's descriptions of a stream whose limits,
// with discard new, refuse new messages.
var fullReasons = []string{"maximum messages exceeded", "maximum bytes exceeded", "maximum messages per subject exceeded"}

// Full reports whether err is the stream refusing a message because its
// own limits are reached and its discard policy is new, and which limit
// (the server's words): it removes none to make room, so nothing is
// stored until the limits are raised or messages removed.
func Full(err error) (limit string, full bool) {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jsStoreFailed {
		return "", false
	}
	for _, r := range fullReasons {
		if strings.Contains(apiErr.Description, r) {
			return r, true
		}
	}
	return "", false
}

// NoRoom reports whether err is a server refusing a message, or a
// stream, for want of room: JetStream's limits reached (the account's
// too), a stream full under its discard new limits, its store's disk
// full, or JetStream shut down (a server whose disk filled does so). It
// passes when the server has room again, without the writer (the tailer
// publishing, a subscriber saving its progress) doing anything but
// trying again.
func NoRoom(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jsInsufficientResources, jsMemoryExceeded, jsStorageExceeded, jsAccountResources,
			jetstream.JSErrCodeJetStreamNotEnabled, jetstream.JSErrCodeJetStreamNotEnabledForAccount:
			return true
		}
	}
	if _, full := Full(err); full {
		return true
	}
	return errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) ||
		err != nil && (strings.Contains(err.Error(), "no space left on device") || strings.Contains(err.Error(), "insufficient resources"))
}

// ServerWords is what the server said of err: a JetStream API error's
// description, or the innermost error's text.
func ServerWords(err error) string {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.Description
	}
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return strings.TrimPrefix(err.Error(), "nats: ")
		}
		err = next
	}
}
