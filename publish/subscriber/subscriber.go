package subscriber

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/mailroom/tailer/publish/jsio"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
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
	saveMu   sync.Mutex
	kick     chan struct{}
	// js and life are Run's, set before anything reads them: life is
	// what a Sink's done runs under, after the Hand that gave the units.
	js   jetstream.JetStream
	life context.Context
	gaps Gaps

	mu sync.Mutex
	// held are the messages delivered and not yet acknowledged, in
	// delivery order.
	held   []*held
	prog   protocol.Progress
	rev    uint64
	loaded bool
	dirty  bool
	// floorRead is when the consumer's ack floor was last read.
	floorRead time.Time
	takenOver bool
	// doneUnsaved counts the batches finished since the record last saved.
	doneUnsaved int
	// pinID is the pin of the last message delivered (pinned consumers).
	pinID string
	stats Stats
}

// NewSubscriber returns a subscriber of c, or an error naming the
// setting that does not hold.
func NewSubscriber(c Config) (*Subscriber, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	s := &Subscriber{cfg: c}
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
	s.mu.Lock()
	st := s.stats
	st.PinID = s.pinID
	s.mu.Unlock()
	st.Gaps, st.OpenGap = s.gaps.State()
	st.TakenElsewhere = s.gaps.Taken()
	if r := s.reader; r != nil {
		st.InDoubt, _ = r.inDoubt()
	}
	return st
}

// pinsOne reports whether the consumer Run is bound to pins one
// subscriber at a time (a consumer made before tailer subscribe pinned,
// or by hand, does not).
func (s *Subscriber) pinsOne() bool {
	c := s.Consumer()
	return c != nil && c.CachedInfo().Config.PriorityPolicy == jetstream.PriorityPolicyPinned
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

// pullExpiry bounds how long a pull request waits on the server. The
// iterator asks again when two of its heartbeats (half the expiry apart)
// are missed: a pull the server did not keep (seen under load after a
// redelivery: the consumer shows no waiting pull while the subscriber
// waits on it) then costs 5 s rather than the default 30 s.
const pullExpiry = 5 * time.Second

// errConsumerLost: the server no longer has the consumer.
var errConsumerLost = errors.New("the consumer is gone from the server")

// ErrPositionUnknown is returned when the consumer is gone and no record
// says where it was.
var ErrPositionUnknown = errors.New("the consumer is gone and no record says where it was")

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
		s.mu.Lock()
		s.stats.Recreated++
		// The old consumer's deliveries cannot be acknowledged any more:
		// the new one delivers what they held again, and the record says
		// which of their batches are done.
		s.held = nil
		s.mu.Unlock()
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

var errPinLost = errors.New("the server no longer pins this subscriber")

// standBy lets go of what a subscriber that no longer delivers held: its
// messages handed back at once (not kept alive by in-progress acks, which
// would leave the durable's other subscribers nothing to deliver while
// they wait on them), the batches its reader may have had delivered again
// by the one that delivers now; then it reads the durable's record again
// and goes on as a standby, delivering once the server pins it again.
func (s *Subscriber) standBy(ctx context.Context, why error) error {
	s.mu.Lock()
	taken := s.takenOver
	if taken {
		// The record moved on without this subscriber: it saves nothing
		// of the messages it lets go (each write would refuse the next
		// save of the one that delivers now).
		s.dirty = false
	}
	s.stats.StoodBy++
	unsaved := s.doneUnsaved
	s.mu.Unlock()
	n := s.ReaderEnded(ctx, ReaderStopped)
	if s.cfg.Log != nil {
		s.cfg.Log.Warn("this subscriber no longer delivers: what it held goes to the one that does; standing by", "durable", s.cfg.Durable, "messages_let_go", n,
			"batches_done_unsaved", unsaved, "why", why)
	}
	s.mu.Lock()
	// What it finished stays true: pinned again, it does not write those
	// batches again (issue 49's fault runs: a subscriber that lost its pin
	// with a batch done and unsaved, pinned again a moment later, wrote it
	// again itself). It reaches the record with the claim (refresh).
	kept := s.prog.Clone()
	s.loaded, s.takenOver, s.pinID = false, false, ""
	s.mu.Unlock()
	if err := s.load(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	s.prog.Absorb(&kept)
	s.mu.Unlock()
	return nil
}

// loadProgress reads the record, trying again while the server cannot be
// asked (a NATS node lost, a leader being elected), and calling wait
// before each pause; a record that does not parse is an error at once.
// Each try is given progressTry, as each save is: a read asked of a frozen
// leader went unanswered for 10 s before it was asked again (issue 49:
// stretches of 19-44 s without a line while the bucket's leader moved).
func (s *Subscriber) loadProgress(ctx context.Context, wait func()) (protocol.Progress, uint64, error) {
	load := func() (protocol.Progress, uint64, error) {
		try, cancel := context.WithTimeout(ctx, progressTry)
		defer cancel()
		return s.cfg.Progress.Load(try)
	}
	p, rev, err := load()
	var stranded Stranded
	for delay := 250 * time.Millisecond; err != nil && !errors.Is(err, ErrUnreadableProgress) && ctx.Err() == nil; delay = min(2*delay, 2*time.Second) {
		if delay == 250*time.Millisecond && s.cfg.Log != nil {
			s.cfg.Log.Warn("cannot read which batches are done; trying again", "durable", s.cfg.Durable, "err", err)
		}
		if jsio.TemporarilyUnavailable(err) && s.js != nil {
			// Its server is cut off from the cluster, and says so to every
			// read until the cut heals (a standby waited out a 60 s
			// partition so). A read that goes unanswered is not counted:
			// moving on those flipped the pinned pair at every election
			// of the bucket's leader (issue 49's fault run 19).
			stranded.Missed(s.js.Conn(), s.cfg.Log, s.cfg.Durable, "the record's read answered 'JetStream temporarily unavailable'")
		}
		wait()
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
		p, rev, err = load()
	}
	return p, rev, err
}

// progressTry is how long one read or save of the durable's record may
// take before it is tried again.
const progressTry = 2 * time.Second

// load reads the record, unless there is no store or it is read already.
func (s *Subscriber) load(ctx context.Context) error {
	if s.cfg.Progress == nil {
		return nil
	}
	s.mu.Lock()
	loaded := s.loaded
	s.mu.Unlock()
	if loaded {
		return nil
	}
	p, rev, err := s.loadProgress(ctx, func() {})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.prog, s.rev, s.loaded = p, rev, true
	s.mu.Unlock()
	return nil
}

// consumer looks the durable up, making it if missing: where the record
// says it was when there is one (lost is true when Run was bound to it
// and saw it go), as configured otherwise.
func (s *Subscriber) consumer(ctx context.Context, js jetstream.JetStream, lost bool) (jetstream.Consumer, error) {
	if c := s.Consumer(); c != nil && !lost {
		// The same one for the next sender: it holds the pin the server
		// gave this subscriber, which a consumer looked up anew would not
		// (and would wait PinnedTTL for).
		return c, nil
	}
	_, pending := s.pulls()
	d := Durable{Stream: s.cfg.Stream, Subject: s.cfg.Subject, Name: s.cfg.Durable, FromStart: s.cfg.FromStart, Action: s.cfg.Action,
		AckWait: s.cfg.AckWait, MaxAckPending: pending, Pinned: s.cfg.Pinned, PinnedTTL: s.cfg.PinnedTTL}
	_, err := LookUp(ctx, js, s.cfg.Stream, s.cfg.Durable, s.cfg.Log)
	missing := errors.Is(err, jetstream.ErrConsumerNotFound)
	if err := s.checkRecord(ctx, js, missing); err != nil {
		return nil, err
	}
	if missing {
		s.mu.Lock()
		anchored, floor := s.prog.Last.Seq != 0, s.prog.Floor
		s.mu.Unlock()
		switch protocol.MakeAt(anchored, s.positioner != nil) {
		case protocol.AfterFloor:
			d.StartSeq = floor + 1
			if s.cfg.Log != nil {
				s.cfg.Log.Warn("the consumer was not on the server: made again where its subscribers had got to, after the last message acknowledged",
					"durable", s.cfg.Durable, "start_seq", d.StartSeq)
			}
		default:
			if err := s.fromSink(ctx, js, &d, lost); err != nil {
				return nil, err
			}
		}
	}
	cons, err := d.Ensure(ctx, js)
	if err != nil {
		return nil, err
	}
	s.seedAtFloor(cons)
	s.cons.Store(&cons)
	if s.cfg.Pinned && !s.pinsOne() && s.cfg.Log != nil {
		s.cfg.Log.Warn("the consumer does not pin one subscriber (made before, or the server is older than 2.11): a second subscriber on it would interleave; delete it to have it made again pinned",
			"durable", s.cfg.Durable)
	}
	return cons, nil
}

// fromSink sets where a consumer missing, of which the subscriber has no
// record, is made: where the Sink's own record says the durable got to
// (Positioner), at that message, not after it (a sink may have stored
// part of it); from the stream's first message when the stream no longer
// holds that message there, or with FromStart; otherwise a consumer Run
// was bound to (lost) is refused: nothing says where it was.
func (s *Subscriber) fromSink(ctx context.Context, js jetstream.JetStream, d *Durable, lost bool) error {
	at, ok, err := s.sinkPosition(ctx)
	if err != nil {
		return err
	}
	if ok {
		if ok, err = StreamHolds(ctx, js, s.cfg.Stream, at.Seq, at.holds, s.cfg.Log); err != nil {
			return err
		}
		if !ok && s.cfg.Log != nil {
			s.cfg.Log.Warn("the stream does not hold what the durable stored from it (deleted and made again, restored or purged): reading it from its first message; the tokens stored before add nothing",
				"durable", s.cfg.Durable, "stored_seq", at.Seq, "batch_id", at.BatchID)
		}
		d.FromStart = d.FromStart || !ok
	}
	if s.positioner != nil {
		s.mu.Lock()
		// Of a stream that may be another now: followed afresh.
		s.prog.Chain = wire.Chain{}
		s.mu.Unlock()
	}
	switch {
	case ok:
		s.seed(at)
		d.StartSeq = at.Seq
		if s.cfg.Log != nil {
			s.cfg.Log.Warn("the consumer was not on the server: made again at the last message the sink holds a token of",
				"durable", s.cfg.Durable, "start_seq", d.StartSeq)
		}
	case lost && !d.FromStart:
		return fmt.Errorf("consumer %s on stream %s: %w: start a subscriber with --from-start to deliver what the stream holds again (the tokens a sink of its own stored add nothing), or make the consumer by hand at the position you know", s.cfg.Durable, s.cfg.Stream, ErrPositionUnknown)
	}
	return nil
}

// sinkPosition is where the Sink's own record says the durable got to.
func (s *Subscriber) sinkPosition(ctx context.Context) (Stored, bool, error) {
	p := s.positioner
	if p == nil {
		return Stored{}, false, nil
	}
	return p.Position(ctx, s.cfg.Stream, s.cfg.Durable)
}

// seed starts the chain, when nothing is known of it, at at: the last
// message the durable stored; not with an action: messages without its
// tokens store nothing, and the last one stored says nothing of those
// after it.
func (s *Subscriber) seed(at Stored) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg.Action == "" && s.prog.Chain.Seed.Seq == 0 && len(s.prog.Chain.Subjects) == 0 {
		s.prog.Chain.Seed = wire.Anchor{Seq: at.Seq, Mark: wire.IDMark(at.BatchID)}
	}
}

// seedAtFloor starts the chain of a sink that keeps its own record, with
// an action, at the consumer's ack floor, when nothing is known of it:
// every message up to it was handled, stored or holding none of the
// action's tokens, which the sink cannot say (seed).
func (s *Subscriber) seedAtFloor(cons jetstream.Consumer) {
	if s.positioner == nil || s.cfg.Action == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.prog.Chain.Seed.Seq == 0 && len(s.prog.Chain.Subjects) == 0 {
		s.prog.Chain.Seed = wire.Anchor{Seq: cons.CachedInfo().AckFloor.Stream}
	}
}

// consume reads messages from cons until ctx is done, the reader is gone,
// or the consumer is lost (errConsumerLost).
func (s *Subscriber) consume(ctx context.Context, cons jetstream.Consumer) error {
	pull, _ := s.pulls()
	iter, err := cons.Messages(pullOpts(cons, pull)...)
	if err != nil {
		return fmt.Errorf("consume %s: %w", s.cfg.Durable, err)
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(runCtx, iter.Stop)
	defer stop()
	s.consuming.Store(true)
	defer s.consuming.Store(false)
	if s.cfg.Log != nil {
		s.cfg.Log.Info("consuming", "stream", s.cfg.Stream, "durable", s.cfg.Durable, "action", s.cfg.Action, "sink", fmt.Sprintf("%T", s.cfg.Sink))
	}
	var wg sync.WaitGroup
	defer func() { cancel(nil); wg.Wait() }()
	s.watch(runCtx, cons, cancel, &wg)
	var stranded Stranded
	// next is an error the gathering of a group met, taken as Next's.
	var next error
	for {
		var msg jetstream.Msg
		err := next
		if next = nil; err == nil {
			msg, err = iter.Next()
		}
		if err != nil {
			if cause := context.Cause(runCtx); errors.Is(cause, ErrReaderGone) {
				return fmt.Errorf("write lines: %w", cause)
			} else if errors.Is(cause, errPinLost) {
				return cause
			}
			if runCtx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			if Lost(runCtx, cons, err) {
				return s.lost(err)
			}
			// The iterator asks again by itself: a consumer whose leader is
			// being elected (a cluster losing a node) misses heartbeats for
			// a while.
			if errors.Is(err, jetstream.ErrNoHeartbeat) {
				if s.standingBy(runCtx, cons) {
					continue
				}
				if s.cfg.Log != nil {
					s.cfg.Log.Warn("no heartbeat from the consumer; asking again", "durable", s.cfg.Durable, "server", s.js.Conn().ConnectedServerName())
				}
				stranded.Missed(s.js.Conn(), s.cfg.Log, s.cfg.Durable, "no heartbeat from the consumer")
				continue
			}
			return fmt.Errorf("consume %s: %w", s.cfg.Durable, err)
		}
		stranded.Heard()
		s.handling.Store(true)
		var group []jetstream.Msg
		group, next = gather(iter, msg, pull)
		err = s.handle(runCtx, group)
		s.handling.Store(false)
		if err != nil {
			if cause := context.Cause(runCtx); errors.Is(cause, ErrReaderGone) {
				return fmt.Errorf("write lines: %w", cause)
			} else if errors.Is(cause, errPinLost) {
				return cause
			}
			if runCtx.Err() != nil && ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// pullOpts are the options of cons's pulls, of pull messages each.
func pullOpts(cons jetstream.Consumer, pull int) []jetstream.PullMessagesOpt {
	cfg := cons.CachedInfo().Config
	expiry := pullExpiry
	if cfg.PriorityPolicy == jetstream.PriorityPolicyPinned && cfg.PinnedTTL > 0 {
		// The pinned subscriber keeps its pin by asking again well
		// within PinnedTTL, idle or not.
		expiry = min(expiry, cfg.PinnedTTL/2)
	}
	opts := []jetstream.PullMessagesOpt{jetstream.PullMaxMessages(pull), jetstream.PullExpiry(expiry)}
	if cfg.PriorityPolicy == jetstream.PriorityPolicyPinned {
		opts = append(opts, jetstream.PullPriorityGroup(PriorityGroup))
	}
	return opts
}

// gather is msg and the messages the iterator holds already, up to pull
// messages and groupTokens tokens (by Mailroom-Count), handed on
// together: a sink that stores them in one transaction (inbox.DB) pays a
// commit and an ack round trip for the group, not for each of a drain's
// messages. It returns the iterator's error that ended the gathering, but
// for the wait for more running out.
func gather(iter jetstream.MessagesContext, msg jetstream.Msg, pull int) ([]jetstream.Msg, error) {
	group := []jetstream.Msg{msg}
	tokens := count(msg)
	for tokens < groupTokens && len(group) < pull {
		m, err := iter.Next(jetstream.NextMaxWait(time.Millisecond))
		if errors.Is(err, nats.ErrTimeout) {
			return group, nil
		}
		if err != nil {
			return group, err
		}
		group = append(group, m)
		tokens += count(m)
	}
	return group, nil
}

// count is how many tokens msg says it carries.
func count(msg jetstream.Msg) int {
	n, _ := strconv.Atoi(msg.Headers().Get(wire.HeaderCount))
	return n
}

// groupTokens bounds the tokens of the messages gathered into one group.
// A sink that stores a group in transactions (inbox.DB, in up to four)
// pays less a token for larger ones: River's insert in parts of 2,000
// tokens against 500 (the measurements are at inbox's pullBatch).
const groupTokens = 8000

// watch starts, on wg, what looks after a consume beside its messages:
// the heartbeat of the messages in hand, the pipe's reader, the end of a
// drain, the pin.
func (s *Subscriber) watch(ctx context.Context, cons jetstream.Consumer, cancel context.CancelCauseFunc, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() { defer wg.Done(); s.heartbeat(ctx, cons) }()
	if r := s.reader; r != nil {
		wg.Add(1)
		go func() { defer wg.Done(); r.watch(ctx, cancel, s.handling.Load) }()
	}
	if s.cfg.UntilDrained {
		wg.Add(1)
		go func() { defer wg.Done(); s.untilDrained(ctx, cons, cancel) }()
	}
	if cfg := cons.CachedInfo().Config; cfg.PriorityPolicy == jetstream.PriorityPolicyPinned {
		wg.Add(2)
		go func() { defer wg.Done(); s.watchPin(ctx, cons, cancel) }()
		go func() { defer wg.Done(); s.keepPin(ctx, cfg.PinnedTTL) }()
	}
}

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
		pin, holding := s.pinID, len(s.held) > 0
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
// subscriber of the durable, or none, while this one holds messages: seen
// twice a second apart, since a consumer's new leader may not know its pin
// at once. Held messages kept alive by in-progress acks meanwhile would
// leave nothing for the server to deliver (the durable's max ack pending
// is this subscriber's), and so nobody to pin: the pair stuck, both
// standing by.
func (s *Subscriber) watchPin(ctx context.Context, cons jetstream.Consumer, cancel context.CancelCauseFunc) {
	missed := 0
	for sleep(ctx, time.Second) {
		s.mu.Lock()
		pin, holding := s.pinID, len(s.held) > 0
		s.mu.Unlock()
		if !holding || pin == "" {
			missed = 0
			continue
		}
		info, err := cons.Info(ctx)
		if err != nil {
			continue
		}
		pinned := ""
		for _, g := range info.PriorityGroups {
			if g.Group == PriorityGroup {
				pinned = g.PinnedClientID
			}
		}
		if pinned == pin {
			missed = 0
			continue
		}
		if missed++; missed == 2 {
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
	holding, pin := len(s.held) > 0, s.pinID
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
	for _, g := range info.PriorityGroups {
		if g.Group == PriorityGroup && g.PinnedClientID != "" && g.PinnedClientID != pin {
			return true
		}
	}
	return false
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
// (the pin of the last message it was given).
func (s *Subscriber) pinnedHere(ctx context.Context) bool {
	s.mu.Lock()
	pin := s.pinID
	s.mu.Unlock()
	cons := s.Consumer()
	if pin == "" || cons == nil {
		return false
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return false
	}
	for _, g := range info.PriorityGroups {
		if g.Group == PriorityGroup && g.PinnedClientID == pin {
			return true
		}
	}
	return false
}

// LookUp looks the consumer up, waiting for the stream when it is not
// there yet (a subscriber started before the tailer made it).
func LookUp(ctx context.Context, js jetstream.JetStream, stream, durable string, log *slog.Logger) (jetstream.Consumer, error) {
	cons, err := lookUpAnswered(ctx, js, stream, durable)
	for waited := false; errors.Is(err, jetstream.ErrStreamNotFound); waited = true {
		if !waited && log != nil {
			log.Warn("the stream is not there yet; waiting for it", "stream", stream)
		}
		if !sleep(ctx, 2*time.Second) {
			return nil, fmt.Errorf("consumer %s on stream %s: %w", durable, stream, err)
		}
		cons, err = lookUpAnswered(ctx, js, stream, durable)
	}
	return cons, err
}

// lookUpAnswered looks the consumer up, asking again while the cluster
// cannot answer (a leader being elected, a node frozen): a subscriber
// that asks then waits instead of exiting (issue 49: "consumer pair on
// stream MAILROOM: context deadline exceeded" while a node was frozen).
func lookUpAnswered(ctx context.Context, js jetstream.JetStream, stream, durable string) (jetstream.Consumer, error) {
	return untilAnswered(ctx, func(ctx context.Context) (jetstream.Consumer, error) { return js.Consumer(ctx, stream, durable) })
}

// Lost reports whether err, from an iterator of cons's messages, means the
// server no longer has the consumer: deleted, or its heartbeats missing
// and the server saying it does not know it. A consumer whose leader is
// being elected misses heartbeats for a while too, and is not lost.
func Lost(ctx context.Context, cons jetstream.Consumer, err error) bool {
	switch {
	case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound):
		return true
	case errors.Is(err, jetstream.ErrNoHeartbeat):
		_, ierr := cons.Info(ctx)
		return errors.Is(ierr, jetstream.ErrConsumerNotFound)
	}
	return false
}

func (s *Subscriber) lost(err error) error {
	if s.cfg.Log != nil {
		s.cfg.Log.Error("the consumer is gone from the server", "durable", s.cfg.Durable, "err", err)
	}
	return errConsumerLost
}

// untilDrained stops consuming once the consumer has delivered everything
// and every batch in hand was handed over, a pipe's reader settled what it
// was handed by waiting for more, and every message whose batches are all
// done has its ack answered: what is still in doubt then (a reader that
// reports) is settled as the subscriber stops.
func (s *Subscriber) untilDrained(ctx context.Context, cons jetstream.Consumer, cancel context.CancelCauseFunc) {
	for sleep(ctx, 250*time.Millisecond) {
		info, err := cons.Info(ctx)
		if err != nil {
			continue
		}
		s.mu.Lock()
		// A pipe's reader has the last batches in doubt until it waits
		// for more (settleIdle): ended before, it would have them
		// delivered again. A message being acknowledged is held until
		// the server answers: ended before, its ack is cut short and it
		// comes again after the ack wait, to a subscriber whose record
		// says it is done, which acknowledges it without a line (issue
		// 45: two resends at once ended so, the dead letter delivered,
		// never removed, and no resend after would see it).
		acking := slices.ContainsFunc(s.held, func(h *held) bool { return h.acking })
		holding := len(s.held)
		s.mu.Unlock()
		inDoubt := false
		if r := s.reader; r != nil {
			_, inDoubt = r.inDoubt()
		}
		if protocol.Drained(protocol.Drain{Handling: s.handling.Load(), InDoubt: inDoubt, Acking: acking,
			Pending: int(info.NumPending), AckPending: info.NumAckPending, Holding: holding}) {
			if s.cfg.Log != nil {
				s.cfg.Log.Info("drained: nothing left to deliver", "durable", s.cfg.Durable, "ack_pending", info.NumAckPending,
					"delivered_stream_seq", info.Delivered.Stream, "ack_floor_stream_seq", info.AckFloor.Stream)
			}
			cancel(nil)
			return
		}
	}
}

// heartbeat keeps the messages in hand from being redelivered while the
// subscriber waits for its reader, or for the next message, every third
// of the consumer's own ack wait: the one the server redelivers after,
// whatever this subscriber was started with (issue 62: a durable made with
// --ack-wait 3s, run without the flag, had every token written 2-4 times).
func (s *Subscriber) heartbeat(ctx context.Context, cons jetstream.Consumer) {
	every := protocol.InProgressEvery(cons.CachedInfo().Config.AckWait, s.cfg.AckWait, DefaultAckWait)
	for sleep(ctx, every) {
		s.mu.Lock()
		for _, h := range s.held {
			h.msg.InProgress()
		}
		s.mu.Unlock()
	}
}

// sleep waits d, reporting false if ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool { return pause.For(ctx, d) == nil }

func seqOf(m *jetstream.MsgMetadata) uint64 {
	if m == nil {
		return 0
	}
	return m.Sequence.Stream
}
