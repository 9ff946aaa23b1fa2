package subscribe

import (
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
)

// Denials keeps the publishes the NATS server denied the subscriber's
// user (a permissions violation, reported asynchronously): an ack
// denied leaves every message unacknowledged, delivered again after the
// ack wait, and the subscriber's only other word of it would be a
// timeout. Each denied subject is said once in the log, and the newest
// stays on /readyz until the subscriber acknowledges a message again.
type Denials struct {
	Log *slog.Logger

	mu sync.Mutex
	// acked is the subscriber's count of messages acknowledged (Watch).
	ackedBy func() int
	subject string
	acked   int
	said    map[string]bool
}

var deniedPublish = regexp.MustCompile(`(?i)publish to "([^"]+)"`)

// Handler is the connection's asynchronous error handler
// (nats.ErrorHandler).
func (d *Denials) Handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return
	}
	m := deniedPublish.FindStringSubmatch(err.Error())
	if m == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.subject, d.acked = m[1], d.ackedNow()
	if d.said == nil {
		d.said = map[string]bool{}
	}
	if what := kindOf(m[1]); !d.said[what] {
		d.said[what] = true
		d.Log.Error("the NATS server denies this subscriber's user a publish", "subject", m[1], "err", deniedWords(m[1]))
	}
}

// Watch gives d the subscriber's count of messages acknowledged: a
// denial is said until it grows.
func (d *Denials) Watch(acked func() int) {
	d.mu.Lock()
	d.ackedBy = acked
	d.mu.Unlock()
}

// ackedNow is the count Watch gave (0 before); d.mu is held.
func (d *Denials) ackedNow() int {
	if d.ackedBy == nil {
		return 0
	}
	return d.ackedBy()
}

// Denied says the newest denial while no message was acknowledged since
// ("": none).
func (d *Denials) Denied() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.subject == "" || d.ackedNow() > d.acked {
		return ""
	}
	return deniedWords(d.subject)
}

// kindOf is what a denied subject is for, to say each once (an ack's
// subject names its message).
func kindOf(subject string) string {
	if strings.HasPrefix(subject, "$JS.ACK.") {
		return "ack"
	}
	return subject
}

// deniedWords says what a denied publish to subject costs, and the way
// out.
func deniedWords(subject string) string {
	if strings.HasPrefix(subject, "$JS.ACK.") {
		parts := strings.SplitN(subject, ".", 5)
		stream := "<stream>"
		if len(parts) > 3 {
			stream = parts[2]
		}
		return fmt.Sprintf("the NATS server denies this subscriber's user publishing acknowledgements (%s, a permissions violation): nothing is acknowledged, and every message is delivered again after the ack wait. "+
			"Allow it to publish to $JS.ACK.%s.> (docs/deploy.md lists the subscriber's permissions)", subject, stream)
	}
	return fmt.Sprintf("the NATS server denies this subscriber's user publishing to %s (a permissions violation): allow it (docs/deploy.md lists the subscriber's permissions)", subject)
}
