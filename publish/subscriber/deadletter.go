package subscriber

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/wire"
)

// Headers of a dead letter, beside the batch headers of package wire.
const (
	// HeaderDeadReason says why the batch was set aside.
	HeaderDeadReason = "Mailroom-Dead-Reason"
	// HeaderDeadDeliveries is how many readers failed on the batch.
	HeaderDeadDeliveries = "Mailroom-Dead-Deliveries"
	// HeaderDeadStream and HeaderDeadSeq say where the message holding the
	// batch is: the tailer's stream, and its sequence there.
	HeaderDeadStream = "Mailroom-Dead-Stream"
	HeaderDeadSeq    = "Mailroom-Dead-Stream-Seq"
	// HeaderDeadBatch is the batch's index in that message (-1: the whole
	// message, which could not be read).
	HeaderDeadBatch = "Mailroom-Dead-Batch"
	// HeaderDeadDurable names the consumer whose reader failed on it.
	HeaderDeadDurable = "Mailroom-Dead-Durable"
)

// DeadStream is the stream holding the dead letters of stream's consumers.
func DeadStream(stream string) string { return safeName(stream) + "_DEAD" }

// DeadSubject is the subject of durable's dead letters; the dead stream
// takes dead.<stream>.>, outside the tailer's subjects.
func DeadSubject(stream, durable string) string {
	return "dead." + safeName(stream) + "." + safeName(durable)
}

// DeadLetters is where a subscriber sets aside a batch its readers keep
// failing on, so that the batches behind it flow: a stream of its own, one
// message per batch, with the reason, the count and the original place.
type DeadLetters struct {
	js      jetstream.JetStream
	stream  string
	subject string
}

// OpenDeadLetters opens (making it if missing, with stream's replicas) the
// dead-letter stream of stream's consumers, for durable's dead letters.
func OpenDeadLetters(ctx context.Context, js jetstream.JetStream, stream, durable string) (*DeadLetters, error) {
	name := DeadStream(stream)
	_, err := untilAnswered(ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, openDeadStream(ctx, js, stream, name) })
	if err != nil {
		return nil, fmt.Errorf("open dead-letter stream %s: %w", name, err)
	}
	return &DeadLetters{js: js, stream: name, subject: DeadSubject(stream, durable)}, nil
}

// openDeadStream makes the dead-letter stream name of stream's consumers
// if missing.
func openDeadStream(ctx context.Context, js jetstream.JetStream, stream, name string) error {
	_, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		replicas := 1
		if s, err := js.Stream(ctx, stream); err == nil {
			replicas = s.CachedInfo().Config.Replicas
		}
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name:        name,
			Description: "tailer subscribe: batches set aside after their readers failed on them; see tailer dead-letters",
			Subjects:    []string{"dead." + safeName(stream) + ".>"},
			Storage:     jetstream.FileStorage,
			Replicas:    replicas,
			// A re-publish after a crash is recognised by its message id.
			Duplicates: 10 * time.Minute,
		})
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			_, err = js.Stream(ctx, name)
		}
	}
	return err
}

// DeadLetter is a batch set aside.
type DeadLetter struct {
	// Stream and Seq say where the message holding the batch is; Batch is
	// its index there (-1: the whole message).
	Stream string
	Seq    uint64
	Batch  int
	// Durable names the consumer.
	Durable    string
	Reason     string
	Deliveries int
	// Header and Body are the batch as a message of its own (the original
	// message's, for a whole message).
	Header nats.Header
	Body   []byte
}

// Put stores d, once: a second Put of the same batch (a crash before its
// batch was marked done) is dropped by the stream as a duplicate.
func (d *DeadLetters) Put(ctx context.Context, dl DeadLetter) error {
	h := nats.Header{}
	for k, v := range dl.Header {
		if k != wire.HeaderMsgID && k != wire.HeaderPrev {
			h[k] = v
		}
	}
	h.Set(HeaderDeadReason, dl.Reason)
	h.Set(HeaderDeadDeliveries, strconv.Itoa(dl.Deliveries))
	h.Set(HeaderDeadStream, dl.Stream)
	h.Set(HeaderDeadSeq, strconv.FormatUint(dl.Seq, 10))
	h.Set(HeaderDeadBatch, strconv.Itoa(dl.Batch))
	h.Set(HeaderDeadDurable, dl.Durable)
	h.Set(wire.HeaderMsgID, fmt.Sprintf("%s:%s:%d:%d", dl.Durable, dl.Stream, dl.Seq, dl.Batch))
	if _, err := d.js.PublishMsg(ctx, &nats.Msg{Subject: d.subject, Header: h, Data: dl.Body}); err != nil {
		return fmt.Errorf("publish dead letter of %s seq %d batch %d to %s: %w", dl.Stream, dl.Seq, dl.Batch, d.stream, err)
	}
	return nil
}

// batchMessage is the header and body of one batch of b as a message of
// its own, in the json format.
func batchMessage(b *Decoded, line int) (nats.Header, []byte, error) {
	tokens := b.Lines()[line]
	body, err := AppendJSON(nil, b.ID, tokens)
	if err != nil {
		return nil, nil, err
	}
	keys := make([]string, len(tokens))
	for i, t := range tokens {
		keys[i] = t.Key
	}
	h := nats.Header{}
	h.Set(wire.HeaderFormat, "json")
	h.Set(wire.HeaderCount, strconv.Itoa(len(tokens)))
	h.Set(wire.HeaderBatchSizes, strconv.Itoa(len(tokens)))
	h.Set(wire.HeaderTokenKeys, strings.Join(keys, ","))
	if b.KeyID != "" {
		h.Set(wire.HeaderKeyID, b.KeyID)
	}
	return h, body, nil
}

// Listed is a dead letter as stored.
type Listed struct {
	// At is its sequence in the dead-letter stream.
	At   uint64
	Time time.Time
	DeadLetter
	// Tokens is how many tokens it holds (0 for a message that could not
	// be read).
	Tokens int
}

// ListDeadLetters returns durable's dead letters, oldest first.
func ListDeadLetters(ctx context.Context, js jetstream.JetStream, stream, durable string) ([]Listed, error) {
	var out []Listed
	err := eachDeadLetter(ctx, js, stream, durable, func(_ jetstream.Stream, l Listed) error {
		out = append(out, l)
		return nil
	})
	return out, err
}

// eachDeadLetter calls f with each of durable's dead letters, oldest
// first, read one at a time by subject: a dead letter removed meanwhile
// (by a resend run at once) is passed over, not waited for.
func eachDeadLetter(ctx context.Context, js jetstream.JetStream, stream, durable string, f func(jetstream.Stream, Listed) error) error {
	name, subject := DeadStream(stream), DeadSubject(stream, durable)
	st, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("dead-letter stream %s: %w", name, err)
	}
	for seq := uint64(1); ; {
		msg, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read dead-letter stream %s: %w", name, err)
		}
		if err := f(st, listed(msg)); err != nil {
			return err
		}
		seq = msg.Sequence + 1
	}
}

func listed(msg *jetstream.RawStreamMsg) Listed {
	h := msg.Header
	l := Listed{At: msg.Sequence, Time: msg.Time, DeadLetter: DeadLetter{
		Stream: h.Get(HeaderDeadStream), Durable: h.Get(HeaderDeadDurable), Reason: h.Get(HeaderDeadReason),
		Header: h, Body: msg.Data,
	}}
	l.Seq, _ = strconv.ParseUint(h.Get(HeaderDeadSeq), 10, 64)
	l.Batch, _ = strconv.Atoi(h.Get(HeaderDeadBatch))
	l.Deliveries, _ = strconv.Atoi(h.Get(HeaderDeadDeliveries))
	l.Tokens, _ = strconv.Atoi(h.Get(wire.HeaderCount))
	return l
}

// CountDeadLetters returns how many of durable's dead letters the
// dead-letter stream holds.
func CountDeadLetters(ctx context.Context, js jetstream.JetStream, stream, durable string) (int, error) {
	name := DeadStream(stream)
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("dead-letter stream %s: %w", name, err)
	}
	subject := DeadSubject(stream, durable)
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return 0, fmt.Errorf("dead-letter stream %s: %w", name, err)
	}
	return int(info.State.Subjects[subject]), nil
}

// RemoveResent removes the dead letters of durable that resend, the
// consumer tailer dead-letters resend delivers them through, has
// acknowledged: every one at or below its ack floor was finished by a
// reader (or was done by the record's word), by this resend or by another,
// run at once or killed before it removed them. A dead letter that cannot
// be read (the whole message, batch -1) is terminated, not finished, and
// stays. It returns how many were removed and how many are left.
func RemoveResent(ctx context.Context, js jetstream.JetStream, stream, durable string, resend jetstream.Consumer) (removed, left int, err error) {
	info, err := resend.Info(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("consumer %s: %w", resend.CachedInfo().Name, err)
	}
	err = eachDeadLetter(ctx, js, stream, durable, func(st jetstream.Stream, l Listed) error {
		if l.At > info.AckFloor.Stream || l.Batch < 0 {
			left++
			return nil
		}
		if err := st.DeleteMsg(ctx, l.At); err != nil {
			// Removed by a resend run at once is removed.
			if _, gerr := st.GetMsg(ctx, l.At); !errors.Is(gerr, jetstream.ErrMsgNotFound) {
				return fmt.Errorf("remove dead letter %d, re-sent: %w", l.At, err)
			}
			return nil
		}
		removed++
		return nil
	})
	return removed, left, err
}
