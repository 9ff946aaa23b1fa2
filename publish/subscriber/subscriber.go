package subscriber

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/pause"
	"github.com/mailroom/tailer/publish/subscriber/protocol"
	"github.com/mailroom/tailer/publish/wire"
)

// Config is a Subscriber's settings, checked once (NewSubscriber).
type Config struct {
	Stream  string
	Subject string
	// Durable names the consumer; it is created (explicit ack) if missing.
	Durable string
	// FromStart makes a new consumer start at the stream's first message
	// instead of the next one published.
	FromStart bool
	// Action keeps only tokens of this action ("" keeps all).
	Action string
	// Sink takes the batches (Lines, inbox.DB, or one's own).
	Sink Sink
	Log  *slog.Logger
	// AckWait is how long the server waits for an ack before redelivering.
	AckWait time.Duration
	// Progress keeps which batches of the messages in hand are done, and
	// where the consumer was, across restarts and between the standby
	// subscribers of a durable; nil keeps them in memory.
	Progress ProgressStore
	// DeadLetters, with MaxDeliveries > 0, takes a batch off the consumer
	// once MaxDeliveries readers failed with it taken and not finished,
	// and a message that cannot be decoded at once; nil: never.
	DeadLetters   DeadLetterStore
	MaxDeliveries int
	// Pinned makes a new consumer deliver to one subscriber at a time (a
	// JetStream priority group with the pinned-client policy): the others
	// on the durable wait as standbys, and one of them is pinned once the
	// active one has not asked for messages for PinnedTTL.
	Pinned    bool
	PinnedTTL time.Duration
	// UntilDrained ends Run once the consumer has nothing left to deliver
	// and nothing is in hand.
	UntilDrained bool
}

// Subscriber hands the batches of a durable JetStream consumer on to a
// Sink. JetStream acknowledges whole messages, and a message of the
// tailer holds up to MAILROOM_MAX_BATCHES_PER_MESSAGE batches: the
// subscriber tracks each batch, acknowledges a message once the Sink has
// said each of its batches is done, and keeps (in Config.Progress) which
// batches of a message are done, so that a sink that fails costs the
// batches it held, not the message.
type Subscriber struct {
	cfg Config
	// reader, positioner and puller are cfg.Sink as each, nil where it
	// is not one.
	reader     reader
	positioner Positioner
	puller     Puller

	// consuming: Run is bound to the consumer (see Consuming).
	consuming atomic.Bool
	// handling: a message is being handed over.
	handling atomic.Bool
	cons     atomic.Pointer[jetstream.Consumer]
	kick     chan struct{}
	// js and life are Run's, set before anything reads them: life is
	// what a Sink's done runs under, after the Hand that gave the units.
	js   jetstream.JetStream
	life context.Context
	gaps Gaps

	// keep steps the machine, what the subscriber holds and the
	// durable's record of it, one step at a time (keeper).
	keep *keeper
	// loaded: the record was read (load).
	loaded atomic.Bool
	counts counts
}

// NewSubscriber returns a subscriber of c, or an error naming the
// setting that does not hold.
func NewSubscriber(c Config) (*Subscriber, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	s := &Subscriber{cfg: c, keep: newKeeper(protocol.Machine{})}
	// What the Sink can do beyond Hand, known once.
	s.reader, _ = c.Sink.(reader)
	s.positioner, _ = c.Sink.(Positioner)
	s.puller, _ = c.Sink.(Puller)
	return s, nil
}

// check says which setting of c does not hold.
func (c Config) check() error {
	switch {
	case c.Stream == "" || c.Subject == "":
		return errors.New("consume: Config.Stream and Config.Subject name the tailer's stream and subject; one is empty")
	case c.Durable == "" || strings.ContainsAny(c.Durable, " \t.*>"):
		return fmt.Errorf("consume: Config.Durable must be a consumer name without spaces, '.', '*' or '>', got %q", c.Durable)
	case c.Sink == nil:
		return errors.New("consume: Config.Sink is nil: give the subscriber somewhere to hand the batches (Lines, inbox.DB, or one's own)")
	case c.AckWait < 0 || c.PinnedTTL < 0 || c.MaxDeliveries < 0:
		return fmt.Errorf("consume: Config.AckWait (%s), PinnedTTL (%s) and MaxDeliveries (%d) may not be negative", c.AckWait, c.PinnedTTL, c.MaxDeliveries)
	}
	return nil
}

// Close stops the goroutine that steps the subscriber's machine. Call it
// once Run returned and a reader's end is settled (ReaderEnded): after
// it, Run returns ErrClosed at once, and Stats says no pin is held.
func (s *Subscriber) Close() { s.keep.stop() }

// Config returns the subscriber's settings.
func (s *Subscriber) Config() Config { return s.cfg }

// DeadLetterStore stores dead letters (DeadLetters does, on a stream).
type DeadLetterStore interface {
	Put(ctx context.Context, dl DeadLetter) error
}

// Stats are a subscriber's counts, for its metrics.
type Stats struct {
	// Messages counts messages delivered; Redelivered those delivered
	// more than once (their tokens may have reached a reader before);
	// Acked those acknowledged.
	Messages, Redelivered, Acked int
	// Batches counts the batches done; Skipped the batches of redelivered
	// messages that were done before and not written again.
	Batches, Skipped int
	// DeadLetters counts batches (and unreadable messages) set aside.
	DeadLetters int
	// ReaderFailures counts readers that failed with batches in hand.
	ReaderFailures int
	// Recreated counts the times the consumer was found missing and made
	// again.
	Recreated int
	// StoodBy counts the times this subscriber let go of what it held and
	// stood by: another one took the durable over, or its pin was lost.
	StoodBy int
	// Gaps counts the places where the stream lacked messages this
	// durable had not read (wire.Gap); OpenGap says the newest that no
	// resync's message has followed yet ("": none).
	Gaps    int
	OpenGap string
	// TakenElsewhere counts the messages of the durable found given to
	// another client (on a consumer that does not pin one subscriber).
	TakenElsewhere int
	// InDoubt is the batches handed to the reader and not done.
	InDoubt int
	// LastDelivery is when the last message came; LastDone when a batch
	// was last done.
	LastDelivery, LastDone time.Time
	// PinID is the pin of the last message delivered, on a pinned
	// consumer: the subscriber is the active one while the server's
	// pinned id is this.
	PinID string
	// NoRoom says why the durable's record cannot be saved, when the
	// server has no room for it ("": it can): nothing more is handed on
	// until it has.
	NoRoom string
}

// Stats returns a copy of the counts.
func (s *Subscriber) Stats() Stats {
	st := s.counts.stats()
	st.PinID = s.status().Pin
	st.Gaps, st.OpenGap = s.gaps.State()
	st.TakenElsewhere = s.gaps.Taken()
	if r := s.reader; r != nil {
		st.InDoubt, _ = r.inDoubt()
	}
	return st
}

// Consuming reports whether Run is bound to its consumer: false before the
// consumer exists and after Run returns (between two senders, say). A
// health check adds whether the server answers for the consumer.
func (s *Subscriber) Consuming() bool { return s.consuming.Load() }

// Consumer returns the consumer Run is bound to (nil before).
func (s *Subscriber) Consumer() jetstream.Consumer {
	if c := s.cons.Load(); c != nil {
		return *c
	}
	return nil
}

// Durable describes a durable consumer of the tailer's stream.
type Durable struct {
	Stream, Subject string
	// Name is the consumer's.
	Name string
	// FromStart makes a new consumer start at the stream's first message
	// instead of the next one published.
	FromStart bool
	// StartSeq, when not 0, makes a new consumer start at this stream
	// sequence (a consumer made again where the lost one was).
	StartSeq uint64
	// Action keeps only batches of this action's subject, and those of
	// the base subject ("" keeps all).
	Action string
	// AckWait is how long the server waits for an ack before redelivering
	// (default 30 s), for a new consumer.
	AckWait time.Duration
	// MaxAckPending is the most messages delivered and not acknowledged;
	// an existing consumer allowing fewer is raised to it.
	MaxAckPending int
	// Pinned and PinnedTTL: see Subscriber.
	Pinned    bool
	PinnedTTL time.Duration
}

// PriorityGroup is the group a pinned consumer's subscribers pull in.
const PriorityGroup = "mailroom"

// Ensure creates the consumer (explicit ack) if it is missing, and returns
// it.
func (d Durable) Ensure(ctx context.Context, js jetstream.JetStream) (jetstream.Consumer, error) {
	cons, err := lookUpAnswered(ctx, js, d.Stream, d.Name)
	if err == nil {
		// A consumer made by an earlier subscriber may allow fewer
		// messages in flight than this one needs.
		if cfg := cons.CachedInfo().Config; cfg.MaxAckPending < d.MaxAckPending {
			cfg.MaxAckPending = d.MaxAckPending
			if cons, err = untilAnswered(ctx, func(ctx context.Context) (jetstream.Consumer, error) { return js.UpdateConsumer(ctx, d.Stream, cfg) }); err != nil {
				return nil, fmt.Errorf("update consumer %s on stream %s: %w", d.Name, d.Stream, err)
			}
		}
		return cons, nil
	}
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("consumer %s on stream %s: %w", d.Name, d.Stream, err)
	}
	// The batches' subjects only: the session markers never count as
	// messages pending for a consumer made now.
	filters := wire.DataSubjects(d.Subject)
	if d.Action != "" {
		// Batches on the base subject mix actions (filtered by the reader,
		// token by token); with a subject per action only the wanted one
		// is read.
		filters = []string{d.Subject, d.Subject + "." + d.Action}
	}
	ackWait := d.AckWait
	if ackWait <= 0 {
		ackWait = DefaultAckWait
	}
	cfg := jetstream.ConsumerConfig{
		Durable:        d.Name,
		Description:    "tailer subscribe",
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        ackWait,
		DeliverPolicy:  jetstream.DeliverNewPolicy,
		FilterSubjects: filters,
		MaxAckPending:  d.MaxAckPending,
	}
	switch {
	case d.StartSeq > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, d.StartSeq
	case d.FromStart:
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	}
	if d.Pinned {
		cfg.PriorityPolicy, cfg.PriorityGroups = jetstream.PriorityPolicyPinned, []string{PriorityGroup}
		cfg.PinnedTTL = d.PinnedTTL
	}
	// Asked again while the cluster cannot answer (a node being killed as
	// the subscriber starts: one exited so in a soak run); made twice, the
	// same configuration is the same consumer.
	cons, err = untilAnswered(ctx, func(ctx context.Context) (jetstream.Consumer, error) { return js.CreateConsumer(ctx, d.Stream, cfg) })
	if err != nil {
		return nil, fmt.Errorf("create consumer %s on stream %s: %w", d.Name, d.Stream, err)
	}
	return cons, nil
}

// pulls is how many messages the Sink takes at once (Puller).
func (s *Subscriber) pulls() (pull, pending int) {
	if p := s.puller; p != nil {
		pull, pending = p.Pulls()
	}
	return max(pull, 1), max(pending, 2)
}

// ErrPositionUnknown is returned when the consumer is gone and no record
// says where it was.
var ErrPositionUnknown = errors.New("the consumer is gone and no record says where it was")

// ErrClosed is returned by a Subscriber used after Close.
var ErrClosed = errors.New("the subscriber is closed")

// Run hands messages on until ctx is done (or, UntilDrained, nothing is
// left to deliver; it returns nil then), the Sink fails, or the reader is
// gone (an error wrapping ErrReaderGone). A reader's batches in doubt
// (Lines) stay pending, kept from redelivery, until ReaderEnded; those of
// another sink are settled as Run returns: the record saved, the
// messages not done delivered again at once. A consumer that vanishes
// from the server is made again where the record (Progress) says it was.
// A subscriber that another one of the durable took over from, or that
// lost its pin, lets what it held go at once and stands by (standBy).
func (s *Subscriber) Run(ctx context.Context, js jetstream.JetStream) error {
	if s.keep.stopped() {
		return fmt.Errorf("consume %s: %w", s.cfg.Durable, ErrClosed)
	}
	s.js, s.life = js, ctx
	if s.kick == nil {
		s.kick = make(chan struct{}, 1)
	}
	if s.reader == nil {
		defer func() {
			end, cancel := context.WithTimeout(context.WithoutCancel(ctx), progressTry)
			defer cancel()
			s.ReaderEnded(end, ReaderStopped)
		}()
	}
	if err := s.load(ctx); err != nil {
		return err
	}
	if at, ok, err := s.sinkPosition(ctx); err != nil {
		return err
	} else if ok {
		s.seed(at)
	}
	cons, err := s.consumer(ctx, js, false)
	if err != nil {
		return err
	}
	for {
		err := s.term(ctx, js, &cons)
		if ctx.Err() != nil || !errors.Is(err, ErrTakenOver) && !errors.Is(err, errPinLost) {
			return err
		}
		if err := s.standBy(ctx, err); err != nil {
			return err
		}
	}
}

// term is one stretch of Run, with a saver of its own: until ctx is done,
// Run must end, or this subscriber no longer delivers (ErrTakenOver,
// errPinLost). A consumer lost on the way is made again.
func (s *Subscriber) term(ctx context.Context, js jetstream.JetStream, cons *jetstream.Consumer) error {
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	saved := make(chan struct{})
	go func() { defer close(saved); s.saver(runCtx, cancel) }()
	defer func() { cancel(nil); <-saved }()
	for {
		err := s.consume(runCtx, *cons)
		if cause := context.Cause(runCtx); errors.Is(cause, ErrTakenOver) {
			return fmt.Errorf("consume %s: %w", s.cfg.Durable, cause)
		}
		if !errors.Is(err, errConsumerLost) {
			return err
		}
		s.counts.recreated.Add(1)
		// The old consumer's deliveries cannot be acknowledged any more:
		// the new one delivers what they held again, and the record says
		// which of their batches are done.
		s.step(protocol.ConsumerGone{})
		if r := s.reader; r != nil {
			r.forget()
		}
		if err := s.save(ctx); err != nil && s.cfg.Log != nil {
			s.cfg.Log.Warn("cannot save progress before making the consumer again", "durable", s.cfg.Durable, "err", err)
		}
		if *cons, err = s.consumer(runCtx, js, true); err != nil {
			return err
		}
	}
}

// errPinLost: the server pins another subscriber of the durable, or none,
// while this one holds messages (see watchPin).
// DefaultAckWait is a new consumer's redelivery delay. Messages sent to a
// subscriber as its node froze or was cut off are lost on the way, and
// with a pipe's two messages awaiting an ack the durable delivers nothing
// more until the server redelivers them (issue 49: 30 s without a line
// after a 20 s freeze of the stream's leader). A subscriber acks the
// messages it holds as in progress every third of the wait, so a short
// one redelivers only what nobody holds.
const DefaultAckWait = 10 * time.Second

// sleep waits d, reporting false if ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool { return pause.For(ctx, d) == nil }
