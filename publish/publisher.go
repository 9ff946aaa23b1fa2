package publish

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/publish/wire"
)

// Destination describes where batches go.
type Destination struct {
	Name    string
	Subject string
	// Duplicates is JetStream's duplicate window for Nats-Msg-Id, and
	// Replicas the number of copies; both only apply when the stream is
	// created.
	Duplicates time.Duration
	Replicas   int
	// Origin is put on every message: the database its positions belong
	// to. The slot incarnation they belong to is Resume's.
	Origin Origin
	// PerAction publishes each action's batches on a subject of its own:
	// Subject.activation and Subject.password_recovery (lanes 0 and 1 of
	// batch.ByAction).
	PerAction bool
}

// LaneSubjects returns the subject of each lane.
func (s Destination) LaneSubjects() []string {
	if s.PerAction {
		return []string{s.Subject + ".activation", s.Subject + ".password_recovery"}
	}
	return []string{s.Subject}
}

const minMaxPayload = 8 << 10

// StreamConfigError is a stream (or server) the tailer cannot keep its
// promise with: retrying does not change it, the operator must.
type StreamConfigError struct {
	Stream string
	Err    error
}

func (e *StreamConfigError) Error() string {
	return "stream " + e.Stream + ": " + e.Err.Error() + " (the tailer refuses to publish to it)"
}
func (e *StreamConfigError) Unwrap() error { return e.Err }

// Publisher sends batches to one JetStream stream, chaining each message to
// the one before with Nats-Expected-Last-Sequence: the tailer is the
// stream's only writer, so the n-th publish of a session expects the
// stream's last sequence at the start plus n-1. A batch whose predecessor
// did not land is refused, so pipelined publishes can never leave a gap that
// a later batch hides, and two tailers (a standby taking over) cannot both
// extend the stream. The chain is by sequence rather than by message id:
// a replica's last message id is not part of its stored state, and
// nats-server 2.15.2 was seen to stall an R3 stream when a replica, after a
// restart, checked the id chain on entries its leader had accepted ("last
// msgid mismatch"); servers before 2.15 also forget the last id outside the
// duplicate window.
type Publisher struct {
	js          jetstream.JetStream
	stream      jetstream.Stream
	name        string
	subjects    []string
	replicas    int
	origin      string
	incarnation string

	// last is the stream's last message, and laneLast the last message on
	// each lane's subject, when the publisher started (zero seq: none).
	last     stored
	laneLast []stored
	// lastPos is, per lane, the position up to which Resume found the
	// tokens published; zero until then.
	lastPos []decoder.Position
	// lastTime is when the stream's last message was stored.
	lastTime time.Time
	// lastSeq is the stream's last sequence when the session started, and
	// next the last sequence the next publish expects.
	lastSeq, next uint64
}

// stored is what the publisher reads of a message already on the stream.
type stored struct {
	seq         uint64
	origin      string
	incarnation string
	pos         decoder.Position
}

// resumable refuses stream configurations that can remove the stream's
// last message while the tailer is away or idle: that message is the resume
// point, and without it a restarted tailer publishes again every token the
// slot replays. Limits that discard the oldest messages keep the newest
// one, and are fine.
func resumable(c jetstream.StreamConfig) error {
	switch {
	case c.Retention == jetstream.WorkQueuePolicy || c.Retention == jetstream.InterestPolicy:
		return fmt.Errorf("retention %s removes messages once they are consumed, and with them the tailer's resume point: use limits retention (the tailer's own stream) and let consumers keep their own position", c.Retention)
	case c.MaxAge > 0:
		return fmt.Errorf("max_age %s removes the last message after a quiet spell, and with it the tailer's resume point: set max_age 0 and bound the stream with max_msgs or max_bytes (discard old)", c.MaxAge)
	}
	return nil
}

// SubjectMatches reports whether subject is matched by pattern under NATS
// rules: tokens separated by '.', '*' matching one token, '>' as the last
// token matching one or more.
func SubjectMatches(pattern, subject string) bool {
	pt, st := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, p := range pt {
		switch {
		case p == ">" && i == len(pt)-1:
			return len(st) > i
		case i >= len(st):
			return false
		case p != "*" && p != st[i]:
			return false
		}
	}
	return len(pt) == len(st)
}

// NewPublisher connects to the stream, creating it (file storage) if it does
// not exist, and reads its last message to learn what was published before.
func NewPublisher(ctx context.Context, nc *nats.Conn, cfg Destination) (*Publisher, error) {
	// One token can take 4 KiB in a json body (every byte of a 254-byte
	// email escaped); batches are split to fit the rest.
	if mp := nc.MaxPayload(); mp < minMaxPayload {
		return nil, &StreamConfigError{cfg.Name, fmt.Errorf("NATS server's max_payload is %d bytes: at least %d are needed", mp, minMaxPayload)}
	}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(1024),
		jetstream.WithPublishAsyncTimeout(30*time.Second))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if cfg.Duplicates <= 0 {
		cfg.Duplicates = 2 * time.Minute
	}
	stream, err := js.Stream(ctx, cfg.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		stream, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name:        cfg.Name,
			Description: "mailroom token batches published by tailer",
			Subjects:    []string{cfg.Subject, cfg.Subject + ".>"},
			Storage:     jetstream.FileStorage,
			Duplicates:  cfg.Duplicates,
			Replicas:    max(cfg.Replicas, 1),
		})
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", cfg.Name, err)
	}
	info := stream.CachedInfo()
	if err := resumable(info.Config); err != nil {
		return nil, &StreamConfigError{cfg.Name, err}
	}
	subjects := cfg.LaneSubjects()
	for _, subject := range subjects {
		if !slices.ContainsFunc(info.Config.Subjects, func(pattern string) bool { return SubjectMatches(pattern, subject) }) {
			return nil, &StreamConfigError{cfg.Name, fmt.Errorf("does not take subject %s (its subjects: %v): set MAILROOM_NATS_SUBJECT to one it takes, or add it to the stream", subject, info.Config.Subjects)}
		}
	}
	p := &Publisher{js: js, stream: stream, name: cfg.Name, subjects: subjects, replicas: max(info.Config.Replicas, 1),
		laneLast: make([]stored, len(subjects)), lastPos: make([]decoder.Position, len(subjects))}
	if cfg.Origin.SystemID != "" {
		p.origin = cfg.Origin.String()
	}
	if err := p.readLast(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// readLast loads the stream's last sequence, which the next publish is
// chained to, and what its last message and the last message on each
// lane's subject say about where they come from.
func (p *Publisher) readLast(ctx context.Context) error {
	info, err := p.stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("stream info: %w", err)
	}
	p.lastSeq, p.next = info.State.LastSeq, info.State.LastSeq
	if info.State.LastSeq == 0 {
		return nil
	}
	msg, err := p.stream.GetMsg(ctx, info.State.LastSeq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		// Removed by retention: nothing to chain to.
	case err != nil:
		return fmt.Errorf("read last message of stream: %w", err)
	default:
		if p.last, err = readStored(msg); err != nil {
			return err
		}
		p.lastTime = msg.Time
	}
	for lane, subject := range p.subjects {
		msg, err := p.stream.GetLastMsgForSubject(ctx, subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read last message on %s: %w", subject, err)
		}
		if p.laneLast[lane], err = readStored(msg); err != nil {
			return err
		}
	}
	return nil
}

func readStored(msg *jetstream.RawStreamMsg) (stored, error) {
	s := stored{seq: msg.Sequence, origin: msg.Header.Get(wire.HeaderOrigin), incarnation: msg.Header.Get(wire.HeaderIncarnation)}
	if v := msg.Header.Get(wire.HeaderPosLast); v != "" {
		var err error
		if s.pos, err = decoder.ParsePosition(v); err != nil {
			return s, fmt.Errorf("message %d on %s: %s: %w", msg.Sequence, msg.Subject, wire.HeaderPosLast, err)
		}
	}
	return s, nil
}

// CheckDuplicate verifies a PubAck that says a batch was already on the
// stream: the sequence it names must hold a message with the batch's id. A
// duplicate ack for a message the stream no longer holds (seen with sequence
// 0 on a NATS 2.10 cluster after a full restart) would otherwise count
// tokens as published that are not.
func (p *Publisher) CheckDuplicate(ctx context.Context, id string, seq uint64) error {
	if seq == 0 {
		return fmt.Errorf("batch %s: duplicate PubAck without a stream sequence: the stream does not show it holds the batch", id)
	}
	msg, err := p.stream.GetMsg(ctx, seq)
	if err != nil {
		return fmt.Errorf("batch %s: duplicate PubAck names sequence %d, which cannot be read: %w", id, seq, err)
	}
	if got := msg.Header.Get(wire.HeaderMsgID); got != id {
		return fmt.Errorf("batch %s: duplicate PubAck names sequence %d, which holds %q", id, seq, got)
	}
	return nil
}

// Replicas is the stream's number of copies.
func (p *Publisher) Replicas() int { return p.replicas }

// LastSeq is the stream's last sequence when the publisher started; 0 for
// an empty stream.
func (p *Publisher) LastSeq() uint64 { return p.lastSeq }

// Stream is the stream the publisher writes to.
func (p *Publisher) Stream() jetstream.Stream { return p.stream }

// LastTime is when the stream's last message was stored (zero for an empty
// stream, or when retention removed it).
func (p *Publisher) LastTime() time.Time { return p.lastTime }

// Close releases what the JetStream context holds for asynchronous
// publishing (its reply subscription); the connection stays open.
func (p *Publisher) Close() { p.js.CleanupPublisher() }

// LastPosition is the WAL position of the last token published on lane's
// subject by the slot incarnation Resume was given; every token of that
// lane at or before it was published (or skipped) by an earlier run.
func (p *Publisher) LastPosition(lane int) decoder.Position { return p.lastPos[lane] }

// Message is one batch ready to send.
type Message struct {
	Lane int
	// First and Last are the positions the batch covers. A batch of a
	// resync has none: ID names it, and Resync the consistent point of the
	// slot it was published for.
	First, Last decoder.Position
	ID, Resync  string
	Count       int
	TokenIDs    string
	TokenKeys   string
	// BatchSizes is the number of tokens of each batch in Body,
	// comma-joined.
	BatchSizes string
	Format     wire.Format
	Body       []byte
}

// PublishAsync sends m and returns the future of its PubAck. Futures
// complete in publishing order.
func (p *Publisher) PublishAsync(m *Message) (jetstream.PubAckFuture, error) {
	msg := &nats.Msg{
		Subject: p.subjects[m.Lane],
		Data:    m.Body,
		Header: nats.Header{
			wire.HeaderCount:      {strconv.Itoa(m.Count)},
			wire.HeaderTokenIDs:   {m.TokenIDs},
			wire.HeaderTokenKeys:  {m.TokenKeys},
			wire.HeaderBatchSizes: {m.BatchSizes},
			wire.HeaderFormat:     {m.Format.String()},
		},
	}
	id := m.ID
	if id == "" {
		id = BatchID(m.First, m.Last)
		msg.Header[wire.HeaderPosFirst] = []string{m.First.String()}
		msg.Header[wire.HeaderPosLast] = []string{m.Last.String()}
	}
	if m.Resync != "" {
		msg.Header[wire.HeaderResync] = []string{m.Resync}
	}
	if p.origin != "" {
		msg.Header[wire.HeaderOrigin] = []string{p.origin}
	}
	if p.incarnation != "" {
		msg.Header[wire.HeaderIncarnation] = []string{p.incarnation}
	}
	fut, err := p.js.PublishMsgAsync(msg, jetstream.WithMsgID(id), jetstream.WithExpectLastSequence(p.next))
	if err != nil {
		return nil, fmt.Errorf("publish batch %s: %w", id, err)
	}
	p.next++
	if m.ID == "" {
		p.lastPos[m.Lane] = m.Last
	}
	return fut, nil
}
