package publish

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"github.com/mailroom/tailer/decoder/wal"
	"github.com/mailroom/tailer/publish/jsio"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/decoder/action"
	"github.com/mailroom/tailer/publish/relay"
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
	Origin relay.Origin
	// PerAction publishes each action's batches on a subject of its own,
	// Subject.<label> (wire.LaneSubject), in the lanes of batch.ByAction.
	PerAction bool
	// PubAckTimeout is how long a publish waits for its PubAck (default
	// 5 s): past it the publish fails, and the session with it.
	PubAckTimeout time.Duration
}

// LaneSubjects returns the subject of each lane.
func (s Destination) LaneSubjects() []string {
	if !s.PerAction {
		return []string{s.Subject}
	}
	var out []string
	for _, label := range action.Labels() {
		out = append(out, wire.LaneSubject(s.Subject, label))
	}
	return out
}

const minMaxPayload = 8 << 10

// apiTimeout bounds a JetStream API request of the session's that has no
// deadline of its own (jsio.GetMsg's is the same).
const apiTimeout = jsio.RequestTimeout

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

// SubjectError is a subject the tailer publishes on (its subject is
// Configured) that the stream does not take; Marker: the subject of the
// session markers.
type SubjectError struct {
	Subject, Configured string
	Subjects            []string
	Marker              bool
}

func (e *SubjectError) Error() string {
	if e.Marker {
		return fmt.Sprintf("does not take subject %s, where every session starts with its markers (its subjects: %v)", e.Subject, e.Subjects)
	}
	return fmt.Sprintf("does not take subject %s (its subjects: %v)", e.Subject, e.Subjects)
}

// Publisher sends batches to one JetStream stream, chaining each message to
// the one before with Nats-Expected-Last-Sequence: the n-th publish of a
// session expects the stream's last sequence at the start plus n-1. A batch
// whose predecessor did not land is refused, so pipelined publishes can
// never leave a gap that a later batch hides. The chain is by sequence
// rather than by message id: a replica's last message id is not part of its
// stored state, and nats-server 2.15.2 was seen to stall an R3 stream when a
// replica, after a restart, checked the id chain on entries its leader had
// accepted ("last msgid mismatch"); servers before 2.15 also forget the last
// id outside the duplicate window.
//
// A chain by sequence alone does not keep another session's publishes
// out: a killed or frozen session's message still on its way expects some
// sequence, and lands if the stream happens to be there when it arrives.
// Resume therefore starts each session with markers that move the stream
// past every sequence such a message can expect, and decides what the
// session must not publish again from the messages the stream holds.
type Publisher struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	name   string
	// subject is Destination.Subject; subjects are the lanes'.
	subject  string
	subjects []string
	marker   string
	replicas int
	// created is when the server created the stream (RFC 3339).
	created     string
	origin      string
	incarnation string
	// idSuffix is added to every batch id (SetUniqueIDs).
	idSuffix string

	// last is the stream's last message when the publisher started (zero
	// seq: none).
	last relay.Published
	// lastTime is when the stream's last message was stored, lastAnchor
	// its place and content.
	lastTime   time.Time
	lastAnchor wire.Anchor
	// lastSeq is the stream's last sequence when the session started, and
	// next the last sequence the next publish expects; limited says its
	// configuration removed old messages as the session started (Trims).
	lastSeq, next uint64
	limited       bool
	// limits says them, for the operator ("" when limited is false).
	limits string
	// seen is what the stream held when the publisher started.
	seen relay.Seen
	// window is what Resume found on the stream of the tokens the session
	// replays.
	window *relay.Window
	// anchors: see Anchors.
	anchors anchors
	// sending is held by each send, and held whole by a quiet look
	// (Quietly), which waits for what was sent before to be stored.
	sending sync.RWMutex
	// prev is, by lane, the last batch message on its subject
	// (wire.HeaderPrev of the next), read once the session's markers are
	// on the stream and moved by each publish (zero before Resume: none
	// said).
	prev []wire.Anchor
	// leader is the server that led the stream when it was last looked at.
	leader atomic.Pointer[string]
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
	// A request the stream's leader does not answer within apiTimeout is
	// one being elected or cut off: the session ends and the next asks
	// again, of another server after two (issue 49: each try waited 5 s,
	// and a session started as the leader was killed streamed 11 s after
	// the node was back).
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(1024),
		jetstream.WithPublishAsyncTimeout(cmp.Or(cfg.PubAckTimeout, 5*time.Second)),
		jetstream.WithDefaultTimeout(apiTimeout))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if cfg.Duplicates <= 0 {
		cfg.Duplicates = 2 * time.Minute
	}
	stream, err := js.Stream(ctx, cfg.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		// Placing a replicated stream takes the cluster longer.
		create, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		stream, err = js.CreateStream(create, jetstream.StreamConfig{
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
	marker := wire.MarkerSubject(cfg.Subject)
	for _, subject := range append(subjects, marker) {
		if !slices.ContainsFunc(info.Config.Subjects, func(pattern string) bool { return SubjectMatches(pattern, subject) }) {
			return nil, &StreamConfigError{cfg.Name, &SubjectError{Subject: subject, Configured: cfg.Subject, Subjects: info.Config.Subjects, Marker: subject == marker}}
		}
	}
	p := &Publisher{js: js, stream: stream, name: cfg.Name, subject: cfg.Subject, subjects: subjects, marker: marker, replicas: max(info.Config.Replicas, 1),
		created: info.Created.UTC().Format(time.RFC3339Nano),
		limited: Trims(info.Config), limits: limitsOf(info.Config), prev: make([]wire.Anchor, len(subjects))}
	p.sawLeader(info)
	if cfg.Origin.SystemID != "" {
		p.origin = cfg.Origin.String()
	}
	if err := p.readLast(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// readLast loads the stream's last sequence, which the next publish is
// chained to, and what its last message says about where it comes from.
func (p *Publisher) readLast(ctx context.Context) error {
	info, err := p.stream.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		return fmt.Errorf("stream info: %w", err)
	}
	p.lastSeq, p.next, p.seen = info.State.LastSeq, info.State.LastSeq, p.seenOf(info)
	p.last, p.lastTime, p.lastAnchor = relay.Published{}, time.Time{}, wire.Anchor{}
	if info.State.LastSeq == 0 {
		return nil
	}
	msg, err := p.getMsg(ctx, info.State.LastSeq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		// Removed by retention: nothing to chain to.
	case err != nil:
		return fmt.Errorf("read last message of stream: %w", err)
	default:
		p.last, p.lastTime = readStored(msg), msg.Time
		p.lastAnchor = wire.Anchor{Seq: msg.Sequence, Mark: wire.Mark(msg.Subject, msg.Header, msg.Data)}
	}
	return nil
}

// LastAnchor is the stream's last message as the publisher opened it, by
// its place and content (zero: none).
func (p *Publisher) LastAnchor() wire.Anchor { return p.lastAnchor }

// readStored reads what the tailer wrote on a message. A message whose
// headers the tailer cannot read is another publisher's (relay.Other).
func readStored(msg *jetstream.RawStreamMsg) relay.Published {
	h := msg.Header
	s := relay.Published{Seq: msg.Sequence, Subject: msg.Subject, Origin: h.Get(wire.HeaderOrigin), Incarnation: h.Get(wire.HeaderIncarnation)}
	switch {
	case wire.IsMarker(h):
		n, k, ok := strings.Cut(h.Get(wire.HeaderFence), "/")
		var errs [5]error
		var after pglogrepl.LSN
		s.FenceN, errs[0] = strconv.Atoi(n)
		s.FenceK, errs[1] = strconv.Atoi(k)
		s.InFlight, errs[2] = strconv.Atoi(h.Get(wire.HeaderInFlight))
		after, errs[3] = pglogrepl.ParseLSN(h.Get(wire.HeaderWindowAfter))
		s.Floor, errs[4] = strconv.ParseUint(h.Get(wire.HeaderWindowFloor), 10, 64)
		s.After = wal.LSN(after)
		if ok && errors.Join(errs[:]...) == nil && s.FenceN >= 1 && s.FenceN <= s.FenceK {
			s.Is = relay.Marker
		}
	case wire.IsBatch(h):
		s.Keys, s.Resync = h.Get(wire.HeaderTokenKeys), h.Get(wire.HeaderResync) != ""
		if v := h.Get(wire.HeaderPosLast); v != "" {
			pos, err := decoder.ParsePosition(v)
			if err != nil {
				return s
			}
			s.Last = pos
			if first, err := decoder.ParsePosition(h.Get(wire.HeaderPosFirst)); err == nil && !pos.Less(first) {
				s.First = first
			}
		} else if !s.Resync && h.Get(wire.HeaderOrigin) != "" {
			return s
		}
		s.Is = relay.Batch
	}
	return s
}

// ErrReusedID is a PubAck saying a message was already on the stream,
// when the message the stream holds under its id carries other tokens:
// the database reuses the WAL positions the id was made of (it was
// restored, and wrote past the point it was restored to). The message was
// not stored; SetUniqueIDs names the next session's messages apart.
var ErrReusedID = errors.New("the stream holds other tokens under this message's id")

// ErrDuplicateGone is a PubAck saying a message was already on the
// stream, at a sequence the stream no longer holds: JetStream keeps an
// id in its duplicate window after the message is gone (its limits, a
// purge, a deletion), so the stream had the batch and lost it.
var ErrDuplicateGone = errors.New("the stream had this batch and no longer holds it: removed by its limits, purged or deleted")

// CheckDuplicate verifies a PubAck that says a message was already on the
// stream: the sequence it names must hold a message with its id and its
// token keys. A duplicate ack for a message the stream no longer holds
// (seen with sequence 0 on a NATS 2.10 cluster after a full restart), or
// for one of the same positions but other tokens, would otherwise count
// tokens as published that are not.
func (p *Publisher) CheckDuplicate(ctx context.Context, id, keys string, seq uint64) error {
	if seq == 0 {
		return fmt.Errorf("batch %s: duplicate PubAck without a stream sequence: the stream does not show it holds the batch", id)
	}
	msg, err := p.getMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("batch %s: duplicate PubAck names sequence %d: %w", id, seq, ErrDuplicateGone)
	}
	if err != nil {
		return fmt.Errorf("batch %s: duplicate PubAck names sequence %d, which cannot be read: %w", id, seq, err)
	}
	if got := msg.Header.Get(wire.HeaderMsgID); got != id {
		return fmt.Errorf("batch %s: duplicate PubAck names sequence %d, which holds %q", id, seq, got)
	}
	if got := msg.Header.Get(wire.HeaderTokenKeys); got != keys {
		return fmt.Errorf("batch %s: duplicate PubAck names sequence %d: %w", id, seq, ErrReusedID)
	}
	return nil
}

// BatchID is the id of a batch covering first to last (see the package
// function BatchID, and SetUniqueIDs).
func (p *Publisher) BatchID(first, last wal.Position) string {
	return BatchID(first, last) + p.idSuffix
}

// SetUniqueIDs makes the ids of the batches published from now on unique
// to this session (the positions, then "@" and the sequence of the
// session's first marker), instead of the positions alone. JetStream drops
// a message whose id it saw within its duplicate window; after a restore,
// the database's new tokens can come at the positions of tokens already
// published, and their batches must not be taken for those.
func (p *Publisher) SetUniqueIDs() { p.idSuffix = "@" + strconv.FormatUint(p.lastSeq+1, 10) }

// Created is when the NATS server created the stream (RFC 3339): a stream
// deleted and made again under its name has another.
func (p *Publisher) Created() string { return p.created }

// Seen is what the stream held when the publisher started.
func (p *Publisher) Seen() relay.Seen { return p.seen }

// sawLeader notes which server leads the stream, as info says.
func (p *Publisher) sawLeader(info *jetstream.StreamInfo) {
	if info.Cluster != nil && info.Cluster.Leader != "" {
		p.leader.Store(&info.Cluster.Leader)
	}
}

// Leader is the server that led the stream when it was last looked at
// (at the start of the session, and at every stream check since); "" for
// a server outside a cluster.
func (p *Publisher) Leader() string {
	if l := p.leader.Load(); l != nil {
		return *l
	}
	return ""
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

// Message is one batch ready to send.
type Message struct {
	Lane int
	// First and Last are the positions the batch covers. A batch of a
	// resync has none: ID names it, and Resync the consistent point of the
	// slot it was published for.
	First, Last wal.Position
	ID, Resync  string
	Count       int
	TokenIDs    string
	TokenKeys   string
	// BatchSizes is the number of tokens of each batch in Body,
	// comma-joined.
	BatchSizes string
	// KeyID names the key that signed the tokens.
	KeyID  string
	Format wire.Format
	Body   []byte
	// Traces and TraceTokens become the message's traceparent and
	// Mailroom-Trace-Tokens headers (see wire.HeaderTraceparent).
	Traces, TraceTokens []string
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
			wire.HeaderKeyID:      {m.KeyID},
		},
	}
	id := m.ID
	if m.Resync == "" {
		id = p.BatchID(m.First, m.Last)
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
	if len(m.Traces) > 0 {
		msg.Header[wire.HeaderTraceparent], msg.Header[wire.HeaderTraceTokens] = m.Traces, m.TraceTokens
	}
	if prev := p.prev[m.Lane]; prev.Mark != "" {
		msg.Header[wire.HeaderPrev] = []string{prev.Mark}
		msg.Header[wire.HeaderPrevSeq] = []string{strconv.FormatUint(prev.Seq, 10)}
	}
	p.sending.RLock()
	defer p.sending.RUnlock()
	fut, err := p.js.PublishMsgAsync(msg, jetstream.WithMsgID(id), jetstream.WithExpectLastSequence(p.next))
	if err != nil {
		return nil, fmt.Errorf("publish batch %s: %w", id, err)
	}
	p.anchors.sent()
	p.next++
	// Stored, it is at the sequence it expects after.
	p.prev[m.Lane] = wire.Anchor{Seq: p.next, Mark: wire.IDMark(id)}
	return fut, nil
}
