package publish

// The pipeline's second half: awaiting each message's PubAck, in order,
// before its batches are done and their positions may be confirmed.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/mailroom/tailer/publish/join"
)

// PubAckWait is how long the oldest message awaiting its PubAck has waited
// (0: none awaits one). A stream leader partitioned or frozen keeps it
// growing until MAILROOM_PUBACK_TIMEOUT ends the session.
func (p *Pipeline) PubAckWait() time.Duration {
	if t := p.waiting.Load(); t != 0 {
		return time.Since(time.Unix(0, t))
	}
	return 0
}

// ErrStreamMoved is a message refused because the stream's last sequence
// is not the one this session chained it to: another writer (a standby
// that took over, a resync) extended the stream, or an earlier message of
// this session was refused. Nothing of it was stored; the next session
// resumes after whatever the stream holds then.
var ErrStreamMoved = errors.New("the stream moved on without this session")

func (p *Pipeline) awaitAcks(ctx context.Context, acks <-chan inFlight, inFlightSlots chan<- struct{}, spareBodies chan<- []byte, spareReady chan<- *ready) error {
	for it := range acks {
		if it.fut != nil {
			p.waiting.Store(it.started.UnixNano())
			select {
			case ack := <-it.fut.Ok():
				if p.Log != nil {
					p.Log.Debug("message acknowledged", "message", it.id, "batches", it.batches, "tokens", it.n, "seq", ack.Sequence, "duplicate", ack.Duplicate)
				}
				endSpans(it.spans, nil, attribute.Int64("messaging.nats.stream_sequence", int64(ack.Sequence)), attribute.Bool("mailroom.duplicate", ack.Duplicate))
				if ack.Duplicate {
					if err := p.Publisher.CheckDuplicate(ctx, it.id, it.keys, ack.Sequence); err != nil {
						return err
					}
					if p.Log != nil {
						p.Log.Info("message was already on the stream", "message", it.id, "seq", ack.Sequence)
					}
				}
				p.Publisher.stored(ack.Sequence, it.fut.Msg(), true, ack.Duplicate)
			case err := <-it.fut.Err():
				endSpans(it.spans, err)
				if isWrongLastSequence(err) {
					return fmt.Errorf("publish message %s: %w: %w", it.id, ErrStreamMoved, err)
				}
				return fmt.Errorf("publish message %s: %w", it.id, err)
			case <-ctx.Done():
				return errors.Join(errors.New("waiting for PubAck"), context.Cause(ctx))
			}
			p.waiting.Store(0)
			if p.Observer != nil {
				p.Observer.MessagePublished(it.batches, it.n, time.Since(it.started))
			}
		}
		select {
		case spareBodies <- it.body:
		default:
		}
		inFlightSlots <- struct{}{}
		for _, r := range it.done {
			if p.Observer != nil {
				if r.published > 0 {
					p.Observer.BatchPublished(r.b, r.published, time.Since(r.since))
				}
				p.Observer.BatchDone(r.b)
			}
			// Once done, the batch may be recycled: nothing reads it after.
			p.Done(r.b)
			r.b = nil
			select {
			case spareReady <- r:
			default:
			}
		}
	}
	return nil
}

// resetRows returns rows with length n, all zero (Publish).
func resetRows(rows []join.TokenState, n int) []join.TokenState {
	if cap(rows) < n {
		rows = make([]join.TokenState, n)
	}
	rows = rows[:n]
	clear(rows)
	return rows
}
