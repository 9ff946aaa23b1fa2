package publish

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire"
)

// legacyInFlight is the most messages a tailer from before session markers
// kept awaiting their PubAck with its settings at their defaults; a stream
// it wrote without markers is fenced at least this wide.
const legacyInFlight = 2

// window is what the stream holds of the tokens a session replays: every
// message of the session's incarnation that covers a position at or after
// the slot's confirmed one, by the positions it covers (its keys are read
// back as the replay reaches them: spans).
type window struct {
	spans spans
	// tokens counts the keys of those messages.
	tokens int
	// max is the furthest position those messages cover: a token past it
	// cannot be on the stream.
	max decoder.Position
	// floor is the lowest sequence of those messages (0: none); messages
	// counts them.
	floor    uint64
	messages int
	// strays counts the messages read that are neither batches nor
	// markers (another publisher's).
	strays int
	// fence is the number of markers the session started with.
	fence int
}

func (w *window) add(m stored) {
	w.spans.add(m.seq, m.first, m.pos)
	if m.keys != "" {
		w.tokens += strings.Count(m.keys, ",") + 1
	}
	if w.max.Less(m.pos) {
		w.max = m.pos
	}
	if w.floor == 0 || m.seq < w.floor {
		w.floor = m.seq
	}
	w.messages++
}

// Resume makes the publisher continue the stream for o, once the caller
// holds the slot. It reads the stream to find the messages holding tokens
// the session will replay (those past o.After), whose keys OnStream reads
// back as the replay reaches them, refusing a stream whose messages since
// o.Since are not o's (another database, another incarnation of the
// slot), and then publishes the session's markers.
//
// What the session skips is decided by token key, from the messages the
// stream holds, never by a position alone: a killed session's publish that
// landed late, a refused message whose successor was accepted, or a
// restored database whose new tokens reuse positions the stream's batches
// came from all make the last message's position lie.
//
// The markers (wire.MarkerSubject) are published first, chained to the
// stream's last sequence, and are as many as the most messages any session
// before may have left on their way (its own bound, read from its
// markers): such a message expects a sequence the markers move the stream
// past, so it is refused, whenever it arrives. One that lands between the
// markers makes the next marker fail, and Resume reads the stream again.
func (p *Publisher) Resume(ctx context.Context, o Owner) error {
	p.incarnation = o.Incarnation
	for attempt := 1; ; attempt++ {
		w, prev, err := p.scan(ctx, o)
		if err != nil {
			return err
		}
		err = p.publishMarkers(ctx, o, w, prev)
		if err == nil {
			p.window = *w
			return p.readChain(ctx)
		}
		if !errors.Is(err, ErrStreamMoved) || attempt == 3 {
			return err
		}
		if err := p.readLast(ctx); err != nil {
			return err
		}
	}
}

// Window describes what Resume found: how many messages of the stream
// hold tokens the session replays, how many of their tokens, the furthest
// position they cover, how many messages are not the tailer's, and how
// many markers the session started with.
func (p *Publisher) Window() (messages, tokens int, max decoder.Position, strays, fence int) {
	w := &p.window
	return w.messages, w.tokens, w.max, w.strays, w.fence
}

// OnStream reports whether t is on the stream already: a message of the
// window Resume found, covering t's position, holds its key. It reads
// that message's keys back from the stream when the replay reaches it,
// and is called for every token the session reads, on one goroutine.
func (p *Publisher) OnStream(ctx context.Context, t *decoder.Token) (bool, error) {
	w := &p.window
	if w.spans.len() == 0 || w.max.Less(t.Pos) {
		return false, nil
	}
	return w.spans.has(ctx, t.Pos, token.RawKeyOf(&t.Secret), p.windowKeys)
}

// windowKeys reads back the token keys of the window's message at seq.
func (p *Publisher) windowKeys(ctx context.Context, seq uint64) (string, error) {
	m, ok, err := p.readWindow(ctx, seq)
	switch {
	case err != nil:
		return "", err
	case !ok:
		return "", errWindowGone(p.name, seq)
	}
	return m.keys, nil
}

// read returns the message at seq; false when the stream no longer holds
// it (removed by its limits, or deleted).
func (p *Publisher) read(ctx context.Context, seq uint64) (stored, bool, error) {
	msg, err := p.getMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return stored{}, false, nil
	}
	if err != nil {
		return stored{}, false, fmt.Errorf("read message %d of stream %s: %w", seq, p.name, err)
	}
	return readStored(msg), true, nil
}

// lastOn returns the last message on subject; false when there is none.
func (p *Publisher) lastOn(ctx context.Context, subject string) (stored, bool, error) {
	msg, err := p.getLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return stored{}, false, nil
	}
	if err != nil {
		return stored{}, false, fmt.Errorf("read the last message on %s of stream %s: %w", subject, p.name, err)
	}
	return readStored(msg), true, nil
}

// scan finds the window of o's session: every message since o.Since of o's
// incarnation covering a position at or after o.After. It returns it with
// the stream's last marker, of whatever session.
//
// Every session's messages come after its markers, and a complete set of
// markers keeps every earlier session's publishes out, so after the last
// complete markers each subject's batches cover positions in order: the
// scan goes back from the stream's end only until each subject shows a
// batch before o.After. The markers then say where the window before them
// starts (wire.HeaderWindowFloor) for a slot confirmed at least as far as
// theirs was; for one confirmed less far (a restored database, a crash
// that lost the slot's last confirmation) the scan reads on, marker by
// marker, until one was written for a position at or before o.After.
// Without markers (a stream written by an older tailer) it goes back as
// after complete markers, which holds unless a late publish reordered
// the stream: then it may read too little, and a token may be published
// twice, never skipped.
func (p *Publisher) scan(ctx context.Context, o Owner) (*window, *stored, error) {
	w := &window{}
	var prev *stored
	if m, ok, err := p.lastOn(ctx, p.marker); err != nil {
		return nil, nil, err
	} else if ok && m.kind == kindMarker {
		prev = &m
	}
	if p.lastSeq <= o.Since {
		return w, prev, nil
	}
	inWindow := func(m stored) bool { return m.kind == kindBatch && !m.resync && m.pos.Commit >= o.After }
	visit := func(m stored) error {
		if m.kind == kindOther {
			w.strays++
			return nil
		}
		if err := p.checkOwner(m, o); err != nil {
			return err
		}
		if inWindow(m) {
			w.add(m)
		}
		return nil
	}

	// The last session's messages: after its markers.
	regionStart := o.Since
	var mine *stored
	if prev != nil && prev.seq > o.Since {
		if err := p.checkOwner(*prev, o); err != nil {
			return nil, nil, err
		}
		mine, regionStart = prev, prev.seq
	}
	// Only stragglers of earlier sessions can follow incomplete markers:
	// no order to go by.
	whole := mine != nil && mine.fenceN < mine.fenceK
	pending := map[string]bool{}
	for _, subject := range p.dataSubjects() {
		m, ok, err := p.lastOn(ctx, subject)
		if err != nil {
			return nil, nil, err
		}
		if !ok || m.seq <= regionStart {
			continue
		}
		if m.kind == kindOther || inWindow(m) {
			pending[subject] = true
		}
	}
	for seq := p.lastSeq; seq > regionStart && (whole || len(pending) > 0); seq-- {
		m, ok, err := p.readWindow(ctx, seq)
		if err != nil {
			return nil, nil, err
		}
		if !ok {
			continue
		}
		if err := visit(m); err != nil {
			return nil, nil, err
		}
		if m.kind == kindBatch && !inWindow(m) {
			delete(pending, m.subject)
		}
	}

	// Before the last session's markers.
	if err := p.scanBeforeMarkers(ctx, o, mine, visit); err != nil {
		return nil, nil, err
	}
	return w, prev, nil
}

// scanBeforeMarkers visits the messages before the last session's markers
// (mine) that the markers say the window may hold, and, for a slot
// confirmed less far than when that session started, further back, marker
// by marker, to one of a session that started from there or before.
func (p *Publisher) scanBeforeMarkers(ctx context.Context, o Owner, mine *stored, visit func(stored) error) error {
	for m := mine; m != nil; {
		if m.after <= o.After {
			for seq := max(m.floor, o.Since+1); seq < m.seq; seq++ {
				s, ok, err := p.readWindow(ctx, seq)
				if err != nil {
					return err
				}
				if ok {
					if err := visit(s); err != nil {
						return err
					}
				}
			}
			return nil
		}
		next := m
		m = nil
		for seq := next.seq - 1; seq > o.Since; seq-- {
			s, ok, err := p.readWindow(ctx, seq)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			if s.kind == kindMarker {
				if err := p.checkOwner(s, o); err != nil {
					return err
				}
				m = &s
				break
			}
			if err := visit(s); err != nil {
				return err
			}
		}
	}
	return nil
}

// readWindow is read for the scan of a session's window: a message gone
// from a stream whose limits remove messages is a *WindowTrimmedError (its
// tokens may be past the slot's confirmed position, a session killed
// before it confirmed them, and which of them the stream had is gone
// with it); gone from one without limits, passed over (purges are the
// stream checks' to find).
func (p *Publisher) readWindow(ctx context.Context, seq uint64) (stored, bool, error) {
	m, ok, err := p.read(ctx, seq)
	if err == nil && !ok && p.limited {
		return stored{}, false, &WindowTrimmedError{Stream: p.name, Seq: seq, Limits: p.limits}
	}
	return m, ok, err
}

// dataSubjects are the subjects batches can be on, whichever way
// MAILROOM_SUBJECT_PER_ACTION was set when they were published.
func (p *Publisher) dataSubjects() []string { return wire.DataSubjects(p.subject) }

// publishMarkers publishes the session's markers, chained to the stream's
// last sequence, and waits for their PubAcks. They say what the scan found
// (w), for the sessions after this one.
func (p *Publisher) publishMarkers(ctx context.Context, o Owner, w *window, prev *stored) error {
	k := max(o.InFlight, 1)
	switch {
	case prev != nil && prev.fenceN < prev.fenceK:
		// Its markers did not all land: what they were to keep out
		// still may come.
		k = max(k, prev.inFlight, prev.fenceK)
	case prev != nil:
		k = max(k, prev.inFlight)
	case p.lastSeq > 0:
		k = max(k, legacyInFlight)
	}
	floor := w.floor
	if floor == 0 {
		floor = p.lastSeq + 1
	}
	// Each marker has an id of its own, so that it names its place by
	// content (Anchors); the duplicate window never matches it.
	var nonce [8]byte
	rand.Read(nonce[:])
	futs := make([]jetstream.PubAckFuture, 0, k)
	for i := 1; i <= k; i++ {
		msg := nats.NewMsg(p.marker)
		msg.Header.Set(nats.MsgIdHdr, fmt.Sprintf("marker-%x-%d/%d", nonce, i, k))
		msg.Header.Set(wire.HeaderFence, strconv.Itoa(i)+"/"+strconv.Itoa(k))
		msg.Header.Set(wire.HeaderInFlight, strconv.Itoa(max(o.InFlight, 1)))
		msg.Header.Set(wire.HeaderWindowAfter, o.After.String())
		msg.Header.Set(wire.HeaderWindowFloor, strconv.FormatUint(floor, 10))
		if p.origin != "" {
			msg.Header.Set(wire.HeaderOrigin, p.origin)
		}
		if p.incarnation != "" {
			msg.Header.Set(wire.HeaderIncarnation, p.incarnation)
		}
		fut, err := p.js.PublishMsgAsync(msg, jetstream.WithExpectLastSequence(p.next))
		if err != nil {
			return fmt.Errorf("publish session marker %d of %d: %w", i, k, err)
		}
		p.next++
		futs = append(futs, fut)
	}
	for i, fut := range futs {
		select {
		case ack := <-fut.Ok():
			p.stored(ack.Sequence, fut.Msg(), false)
		case err := <-fut.Err():
			if isWrongLastSequence(err) {
				return fmt.Errorf("session marker %d of %d: %w: %w", i+1, k, ErrStreamMoved, err)
			}
			return fmt.Errorf("session marker %d of %d: %w", i+1, k, err)
		case <-ctx.Done():
			return fmt.Errorf("waiting for the session markers' PubAcks: %w", ctx.Err())
		}
	}
	w.fence = k
	return nil
}

// WindowTrimmedError is a stream whose limits removed a message the
// session replays the tokens of (published, not yet confirmed to the
// slot): which of those tokens the stream had is gone with it, and
// publishing them again would repeat them.
type WindowTrimmedError struct {
	Stream string
	Seq    uint64
	Limits string
}

func (e *WindowTrimmedError) Error() string {
	return fmt.Sprintf("stream %s's limits (%s) removed message %d, which holds tokens the slot replays: publishing them again would repeat the ones it had, and a consumer that had not read them lost them",
		e.Stream, e.Limits, e.Seq)
}

// isWrongLastSequence reports whether err is a publish refused because the
// stream's last sequence is not the one it was chained to.
func isWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// readChain reads, for each subject the session publishes on, the last
// batch message there: the next one's predecessor (wire.HeaderPrev). Read
// after the markers, every message before them is seen; one after them
// makes the session's first publish fail, whatever it names.
func (p *Publisher) readChain(ctx context.Context) error {
	p.prev = make([]wire.Anchor, len(p.subjects))
	for i, subject := range p.subjects {
		msg, err := p.getLastMsgForSubject(ctx, subject)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			p.prev[i] = wire.Anchor{Mark: wire.ChainStart}
		case err != nil:
			return fmt.Errorf("read the last message on %s of stream %s: %w", subject, p.name, err)
		default:
			p.prev[i] = wire.Anchor{Seq: msg.Sequence, Mark: wire.Mark(msg.Subject, msg.Header, msg.Data)}
		}
	}
	return nil
}
