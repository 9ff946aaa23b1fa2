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
// a message to it (it answers 409, or 404 with none waiting).
func (s *Subscriber) keepPin(ctx context.Context, ttl time.Duration) {
	if ttl <= 0 {
		return
	}
	next := "$JS.API.CONSUMER.MSG.NEXT." + s.cfg.Stream + "." + s.cfg.Durable
	every := protocol.KeepPinEvery(ttl)
	for sleep(ctx, every) {
		s.mu.Lock()
		pin, holding := s.h.Pin, s.h.Holding()
		s.mu.Unlock()
		if !holding || pin == "" {
			continue
		}
		req, _ := json.Marshal(keepPinRequest{Batch: 1, MaxBytes: 1, NoWait: true, Group: PriorityGroup, ID: pin})
		try, cancel := context.WithTimeout(ctx, every)
		s.js.Conn().RequestWithContext(try, next, req)
		cancel()
	}
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
// the core judges the pins it is shown a second apart (PinSeen).
func (s *Subscriber) watchPin(ctx context.Context, cons jetstream.Consumer, cancel context.CancelCauseFunc) {
	for sleep(ctx, time.Second) {
		s.mu.Lock()
		watching := s.h.WatchesPin()
		s.mu.Unlock()
		if !watching {
			continue
		}
		info, err := cons.Info(ctx)
		if err != nil {
			continue
		}
		s.mu.Lock()
		lost := s.h.PinSeen(pinnedIn(info))
		s.mu.Unlock()
		if lost {
			cancel(errPinLost)
			return
		}
	}
}

// standingBy reports whether this subscriber stands by, holding nothing,
// while the server, answering at once, pins another subscriber of the
// durable: its pulls then wait without heartbeats while the pinned one is
// delivered to, which says nothing of its server. Counted as misses, they
// moved every standby to another server every 12 s (issue 49's fault runs),
// each time with its pulls asked again.
func (s *Subscriber) standingBy(ctx context.Context, cons jetstream.Consumer) bool {
	s.mu.Lock()
	holding, pin := s.h.Holding(), s.h.Pin
	s.mu.Unlock()
	if holding {
		return false
	}
	try, cancel := context.WithTimeout(ctx, progressTry)
	defer cancel()
	info, err := cons.Info(try)
	if err != nil {
		return false
	}
	pinned := pinnedIn(info)
	return pinned != "" && pinned != pin
}

// Unpin lets the server pin another subscriber of the durable at once,
// rather than after PinnedTTL, when this one is the pinned one: for a
// subscriber that stops.
func (s *Subscriber) Unpin(ctx context.Context, js jetstream.JetStream) {
	if !s.pinnedHere(ctx) {
		return
	}
	if st, err := js.Stream(ctx, s.cfg.Stream); err == nil {
		st.UnpinConsumer(ctx, s.cfg.Durable, PriorityGroup)
	}
}

// pinnedHere reports whether the server, asked now, pins this subscriber
// (the pin of the last message it was given), as the core judges it.
func (s *Subscriber) pinnedHere(ctx context.Context) bool {
	s.mu.Lock()
	pin := s.h.Pin
	s.mu.Unlock()
	if pin == "" {
		return false
	}
	pinned := s.serverPin(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.h.PinnedHere(pinned)
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
