package subscriber

// The pin: a pinned consumer delivers to one subscriber of a durable at
// a time; these keep it, watch it, and let it go.

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/subscriber/protocol"
)

// pinsOne reports whether the consumer Run is bound to pins one
// subscriber at a time (a consumer made before tailer subscribe pinned,
// or by hand, does not).
func (s *Subscriber) pinsOne() bool {
	c := s.Consumer()
	return c != nil && c.CachedInfo().Config.PriorityPolicy == jetstream.PriorityPolicyPinned
}

var errPinLost = errors.New("the server no longer pins this subscriber")

// keepPin keeps the server pinning this subscriber while it holds
// messages, however long its sink takes: the server lets go of a pin
// that has not asked for messages within the consumer's PinnedTTL, and
// while the sink works the subscriber asks for none (issue 62: a sender
// taking 12-40 s a line had its pin taken every 10-20 s, the messages
// it held delivered again to the other subscriber, or to it, and none
// acknowledged in 305 s). A request that names the pin resets the
// server's timer; this one allows one byte, so the server never delivers
// a message to it (it answers 409, or 404 with none waiting). The keeper
// asks for it (duties) and does not wait: the request waits for its
// answer on its own, until the next is due.
func (s *Subscriber) keepPin(ctx context.Context, pin string, every time.Duration) {
	next := "$JS.API.CONSUMER.MSG.NEXT." + s.cfg.Stream + "." + s.cfg.Durable
	req, _ := json.Marshal(keepPinRequest{Batch: 1, MaxBytes: 1, NoWait: true, Group: PriorityGroup, ID: pin})
	go func() {
		try, cancel := context.WithTimeout(ctx, every)
		defer cancel()
		s.js.Conn().RequestWithContext(try, next, req)
	}()
}

// keepPinRequest is a pull request that delivers nothing (keepPin).
type keepPinRequest struct {
	Batch    int    `json:"batch"`
	MaxBytes int    `json:"max_bytes"`
	NoWait   bool   `json:"no_wait"`
	Group    string `json:"group"`
	ID       string `json:"id"`
}

// watchPin ends the consume with errPinLost once the server pins another
// subscriber of the durable, or none, while this one holds messages, as
// the machine judges the pins it is shown a second apart (PinSeen).
func (s *Subscriber) watchPin(ctx context.Context, cancel context.CancelCauseFunc) {
	for sleep(ctx, time.Second) {
		if _, lost := s.withPin(ctx, protocol.PinWatchDue{}).(protocol.PinLost); lost {
			cancel(errPinLost)
			return
		}
	}
}

// missCounts reports whether a heartbeat the consume's pulls missed
// counts as the server not heard. Not for a standby, holding nothing,
// while the server, answering at once, pins another subscriber of the
// durable: its pulls then wait without heartbeats while the pinned one is
// delivered to, which says nothing of its server. Counted as misses, they
// moved every standby to another server every 12 s (issue 49's fault runs),
// each time with its pulls asked again.
func (s *Subscriber) missCounts(ctx context.Context) bool {
	_, counts := s.withPin(ctx, protocol.HeartbeatMissed{}).(protocol.CountMiss)
	return counts
}

// withPin steps the machine with e, and again with the pin the server
// gives when it asks for it (LookAtPin; "" when the server does not say
// within progressTry). It returns the machine's last answer (nil: none).
func (s *Subscriber) withPin(ctx context.Context, e protocol.Found) protocol.ToDo {
	cmds := s.step(e)
	if len(cmds) == 0 {
		return nil
	}
	look, ok := cmds[0].(protocol.LookAtPin)
	if !ok {
		return cmds[0]
	}
	try, cancel := context.WithTimeout(ctx, progressTry)
	defer cancel()
	if cmds = s.step(protocol.PinLooked{For: look.For, Pinned: s.serverPin(try)}); len(cmds) == 0 {
		return nil
	}
	return cmds[0]
}

// Unpin lets the server pin another subscriber of the durable at once,
// rather than after PinnedTTL, when this one is the pinned one (the pin
// of the last message it was given), as the machine judges it: for a
// subscriber that stops.
func (s *Subscriber) Unpin(ctx context.Context, js jetstream.JetStream) {
	if _, ok := s.withPin(ctx, protocol.Stopping{}).(protocol.Unpin); !ok {
		return
	}
	if st, err := js.Stream(ctx, s.cfg.Stream); err == nil {
		st.UnpinConsumer(ctx, s.cfg.Durable, PriorityGroup)
	}
}

// serverPin is the pin the server, asked now, gives the durable's group
// ("": none, or the server did not say).
func (s *Subscriber) serverPin(ctx context.Context) string {
	cons := s.Consumer()
	if cons == nil {
		return ""
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return ""
	}
	return pinnedIn(info)
}

// pinnedIn is the pin the server gives the durable's priority group, as
// info says ("": none).
func pinnedIn(info *jetstream.ConsumerInfo) string {
	for _, g := range info.PriorityGroups {
		if g.Group == PriorityGroup {
			return g.PinnedClientID
		}
	}
	return ""
}
