package publish

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"github.com/mailroom/tailer/decoder/wal"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/publish/relay"
	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire"
)

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
// past, so it is refused, whenever it arrives. They are chained to the
// last sequence the publisher opened the stream at, which its caller
// judged the stream by: a message that lands before them fails the
// resume (ErrStreamMoved), and the next session looks at the stream
// afresh.
func (p *Publisher) Resume(ctx context.Context, o relay.Owner) error {
	p.incarnation = o.Incarnation
	w, prev, err := relay.Scan(&streamReader{ctx: ctx, p: p}, p.scanned(), o)
	if err != nil {
		return err
	}
	if err := p.publishMarkers(ctx, o, w, prev); err != nil {
		return err
	}
	p.window = w
	return p.readChain(ctx)
}

// scanned is what a scan of the stream starts from.
func (p *Publisher) scanned() relay.Stream {
	return relay.Stream{Name: p.name, LastSeq: p.lastSeq, Limited: p.limited, Limits: p.limits, Marker: p.marker, Data: wire.DataSubjects(p.subject)}
}

// streamReader reads the publisher's stream, from its leader, for a scan.
type streamReader struct {
	ctx context.Context
	p   *Publisher
}

// At is the message at seq; false when the stream no longer holds it
// (removed by its limits, or deleted).
func (r *streamReader) At(seq uint64) (relay.Published, bool, error) {
	msg, err := r.p.getMsg(r.ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return relay.Published{}, false, nil
	}
	if err != nil {
		return relay.Published{}, false, fmt.Errorf("read message %d of stream %s: %w", seq, r.p.name, err)
	}
	return readStored(msg), true, nil
}

// LastOn is the last message on subject; false when there is none.
func (r *streamReader) LastOn(subject string) (relay.Published, bool, error) {
	msg, err := r.p.getLastMsgForSubject(r.ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return relay.Published{}, false, nil
	}
	if err != nil {
		return relay.Published{}, false, fmt.Errorf("read the last message on %s of stream %s: %w", subject, r.p.name, err)
	}
	return readStored(msg), true, nil
}

// Window describes what Resume found: how many messages of the stream
// hold tokens the session replays, how many of their tokens, the furthest
// position they cover, how many messages are not the tailer's, and how
// many markers the session started with.
func (p *Publisher) Window() (messages, tokens int, max wal.Position, strays, fence int) {
	w := p.window
	if w == nil {
		return 0, 0, wal.Position{}, 0, 0
	}
	return w.Messages, w.Tokens, w.Max, w.Strays, w.Fence
}

// OnStream reports whether t is on the stream already: a message of the
// window Resume found, covering t's position, holds its key. It reads
// that message's keys back from the stream when the replay reaches it,
// and is called for every token the session reads, on one goroutine.
func (p *Publisher) OnStream(ctx context.Context, t *decoder.Token) (bool, error) {
	if p.window == nil {
		return false, nil
	}
	return p.window.Has(t.Pos, token.RawKeyOf(&t.Secret), func(seq uint64) (string, error) {
		m, ok, err := (&streamReader{ctx: ctx, p: p}).At(seq)
		switch {
		case err != nil:
			return "", err
		case !ok:
			return "", errWindowGone(p.name, seq)
		}
		return m.Keys, nil
	})
}

// errWindowGone is a message of the window gone from the stream between
// the scan and the replay.
func errWindowGone(stream string, seq uint64) error {
	return fmt.Errorf("message %d of stream %s, which holds tokens the slot replays, left the stream during the resume: the next session reads the stream again", seq, stream)
}

// publishMarkers publishes the session's markers, chained to the stream's
// last sequence, and waits for their PubAcks. They say what the scan found
// (w), for the sessions after this one.
func (p *Publisher) publishMarkers(ctx context.Context, o relay.Owner, w *relay.Window, prev *relay.Published) error {
	k, floor := relay.Fence(o, w, prev, p.lastSeq)
	// Each marker has an id of its own, so that it names its place by
	// content (Anchors); the duplicate window never matches it.
	var nonce [8]byte
	rand.Read(nonce[:])
	futs := make([]jetstream.PubAckFuture, 0, k)
	for i := 1; i <= k; i++ {
		msg := nats.NewMsg(p.marker)
		msg.Header.Set(nats.MsgIdHdr, fmt.Sprintf("%s%x-%d/%d", wire.MarkerID, nonce, i, k))
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
			p.stored(ack.Sequence, fut.Msg(), false, ack.Duplicate)
		case err := <-fut.Err():
			if isWrongLastSequence(err) {
				return fmt.Errorf("session marker %d of %d: %w: %w", i+1, k, ErrStreamMoved, err)
			}
			return fmt.Errorf("session marker %d of %d: %w", i+1, k, err)
		case <-ctx.Done():
			return fmt.Errorf("waiting for the session markers' PubAcks: %w", ctx.Err())
		}
	}
	w.Fence = k
	return nil
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
