package daemon

import (
	"context"
	"errors"
	"fmt"
	"github.com/mailroom/tailer/publish/jsio"
	"regexp"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/internal/embedded"
	"github.com/mailroom/tailer/internal/pause"
	"github.com/mailroom/tailer/publish/relay"
)

// The causes of a NATS server that takes no batches, which retrying does
// not mend and which the operator must hear of (issue 62: a full store
// and a denied subject showed only as "nats: timeout waiting for ack",
// /readyz as "not streaming", tailer status exit 0): the embedded server's
// store out of disk, a server without room for the stream, and the
// tailer's user denied publishing. Each is a refusal of the relay's
// (relay.NATSStoresNothing), said once, on /readyz, tailer_blocked and
// tailer status, until a session's markers are stored again.

// denial is a publish the server refused the tailer's user.
type denial struct {
	subject string
	at      time.Time
}

var deniedPublish = regexp.MustCompile(`(?i)publish to "([^"]+)"`)

// natsError is the NATS connection's handler of asynchronous errors: a
// publish the server denied is kept, and ends the streaming session at
// once (its PubAck would only time out).
func (d *Daemon) natsError(_ *nats.Conn, _ *nats.Subscription, err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return
	}
	m := deniedPublish.FindStringSubmatch(err.Error())
	if m == nil {
		return
	}
	if last := d.denied.Swap(&denial{subject: m[1], at: time.Now()}); last == nil || last.subject != m[1] {
		d.log.Warn("the NATS server denied a publish", "subject", m[1], "err", err)
	}
	d.trouble(errors.New(d.deniedMessage()))
}

// trouble tells the relay what keeps NATS from storing anything, found
// while a session streams: it stops the session.
func (d *Daemon) trouble(err error) {
	st := d.streaming.Load()
	if st == nil {
		return
	}
	st.tell(func() {
		for _, cmd := range d.step(relay.NATSTrouble{Err: err}) {
			if c, ok := cmd.(relay.Stop); ok {
				st.stop(&refusalCause{c.Refusal})
			}
		}
	})
}

// deniedMessage says that NATS denies the tailer's user publishing, and
// what it must be allowed.
func (d *Daemon) deniedMessage() string {
	user := "the tailer's NATS user"
	if d.cfg.NATSUser != "" {
		user += " " + d.cfg.NATSUser
	}
	return fmt.Sprintf("the NATS server denies %s publishing (a permissions violation): allow it to publish to %s and %s.> (the batches', the session markers' and the per-action subjects), "+
		"and to use the JetStream API of stream %s; the tailer publishes what waits in the slot by itself once it may", user, d.cfg.Subject, d.cfg.Subject, d.cfg.Stream)
}

// watchStore looks at the embedded server's store every second while ctx
// lasts (store nil: NATS is not this process's): what keeps it from taking
// messages ends the streaming session at once, and JetStream shut down
// for want of disk is turned on again once the disk has room
// (embedded.Store.Problem).
func (d *Daemon) watchStore(ctx context.Context, store *embedded.Store) {
	if store == nil {
		return
	}
	for pause.For(ctx, time.Second) == nil {
		p := store.Problem()
		if p == "" {
			d.storeProblem.Store(nil)
			continue
		}
		d.storeProblem.Store(&p)
		d.trouble(errors.New(p))
	}
}

// natsCause says why a session that began at start and ended in err on
// NATS got nothing stored, when the operator must act on it ("" when
// retrying is all it takes: a leader being elected, a server restarting).
func (d *Daemon) natsCause(err error, start time.Time) string {
	if p := d.storeProblem.Load(); p != nil {
		return *p
	}
	if dn := d.denied.Load(); dn != nil && !dn.at.Before(start) {
		return d.deniedMessage()
	}
	if limit, full := jsio.Full(err); full {
		return fmt.Sprintf("stream %s is full (%s): its limits refuse new messages (discard new) and remove none to make room. Raise them (nats stream edit %s), or remove what consumers have read; "+
			"the tailer confirms nothing meanwhile, and publishes what waits in the slot by itself once the stream takes messages again", d.cfg.Stream, limit, d.cfg.Stream)
	}
	if jsio.NoRoom(err) {
		return fmt.Sprintf("the NATS server has no room for stream %s's batches (%s): free or grow its store (its disk, JetStream's max_file_store, the account's max_storage). "+
			"The tailer confirms nothing meanwhile, and publishes what waits in the slot by itself once the server has room", d.cfg.Stream, jsio.ServerWords(err))
	}
	return ""
}
