package consume

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire"
	"github.com/nats-io/nats.go/jetstream"
)

// Subscriber copies batches from a durable JetStream consumer to a writer as
// lines, acknowledging each message only once its lines are out of reach of
// a crash: written (to a file), or taken by the reader of a pipe and
// followed by the next message (see Taken), so that a crash of either side
// redelivers rather than loses.
type Subscriber struct {
	Stream  string
	Subject string
	// Durable names the consumer; it is created (explicit ack) if missing.
	Durable string
	// FromStart makes a new consumer start at the stream's first message
	// instead of the next one published.
	FromStart bool
	// Action keeps only tokens of this action ("" keeps all).
	Action string
	// JSON writes {"batch":..., "tokens":[...]} lines instead of collector
	// lines.
	JSON bool
	// MaxTokensPerLine splits a batch into lines of at most this many
	// tokens (0: one line per batch).
	MaxTokensPerLine int
	// Dedup, if set, drops tokens whose Key it has seen: tokens written
	// before in this run, or by an earlier run into the same file (see
	// SeedFromOutput).
	Dedup *Dedup[string]
	// Out receives the lines; each message's lines go out in one Write.
	Out io.Writer
	// Pipe, when set, is Out as the write end of a pipe. A message is then
	// acknowledged only once the reader has taken the next one: a reader
	// that reads its pipe line by line takes more only when it is done
	// with what it holds, so what is acknowledged was processed. The last
	// message taken, and the one being handed over, are in doubt: kept
	// from redelivery while the subscriber runs, and settled by Settle
	// when it stops.
	Pipe *Pipe
	Log  *slog.Logger
	// AckWait is how long the server waits for an ack before redelivering.
	AckWait time.Duration

	mu      sync.Mutex
	inDoubt []doubt
	// consuming: Run is bound to the consumer (see Consuming).
	consuming atomic.Bool
	// Redelivered counts messages delivered more than once: their tokens
	// may have reached a reader before. Acked counts those acknowledged.
	Redelivered, Acked int
}

// Consuming reports whether Run is bound to its consumer: false before the
// consumer exists and after Run returns (between two senders, say). A
// health check adds whether the server answers for the consumer.
func (s *Subscriber) Consuming() bool { return s.consuming.Load() }

// doubt is a message whose lines a reader may not have processed yet.
type doubt struct {
	msg  jetstream.Msg
	keys []string
}

// Consumer creates or looks up the durable consumer.
func (s *Subscriber) Consumer(ctx context.Context, js jetstream.JetStream) (jetstream.Consumer, error) {
	return Durable{Stream: s.Stream, Subject: s.Subject, Name: s.Durable, FromStart: s.FromStart, Action: s.Action, AckWait: s.AckWait,
		MaxAckPending: maxAckPending}.Ensure(ctx, js)
}

// Durable describes a durable consumer of the tailer's stream.
type Durable struct {
	Stream, Subject string
	// Name is the consumer's.
	Name string
	// FromStart makes a new consumer start at the stream's first message
	// instead of the next one published.
	FromStart bool
	// Action keeps only batches of this action's subject, and those of
	// the base subject ("" keeps all).
	Action string
	// AckWait is how long the server waits for an ack before redelivering
	// (default 30 s), for a new consumer.
	AckWait time.Duration
	// MaxAckPending is the most messages delivered and not acknowledged;
	// an existing consumer allowing fewer is raised to it.
	MaxAckPending int
}

// Ensure creates the consumer (explicit ack) if it is missing, and returns
// it.
func (d Durable) Ensure(ctx context.Context, js jetstream.JetStream) (jetstream.Consumer, error) {
	cons, err := js.Consumer(ctx, d.Stream, d.Name)
	if err == nil {
		// A consumer made by an earlier subscriber may allow fewer
		// messages in flight than this one needs.
		if cfg := cons.CachedInfo().Config; cfg.MaxAckPending < d.MaxAckPending {
			cfg.MaxAckPending = d.MaxAckPending
			if cons, err = js.UpdateConsumer(ctx, d.Stream, cfg); err != nil {
				return nil, fmt.Errorf("update consumer %s on stream %s: %w", d.Name, d.Stream, err)
			}
		}
		return cons, nil
	}
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("consumer %s on stream %s: %w", d.Name, d.Stream, err)
	}
	filters := []string{d.Subject, d.Subject + ".>"}
	if d.Action != "" {
		// Batches on the base subject mix actions (filtered by the reader,
		// token by token); with a subject per action only the wanted one
		// is read.
		filters = []string{d.Subject, d.Subject + "." + d.Action}
	}
	deliver := jetstream.DeliverNewPolicy
	if d.FromStart {
		deliver = jetstream.DeliverAllPolicy
	}
	ackWait := d.AckWait
	if ackWait <= 0 {
		ackWait = 30 * time.Second
	}
	cons, err = js.CreateConsumer(ctx, d.Stream, jetstream.ConsumerConfig{
		Durable:        d.Name,
		Description:    "tailer subscribe",
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        ackWait,
		DeliverPolicy:  deliver,
		FilterSubjects: filters,
		MaxAckPending:  d.MaxAckPending,
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer %s on stream %s: %w", d.Name, d.Stream, err)
	}
	return cons, nil
}

// maxAckPending is the last message taken by a pipe's reader, held, and
// the next one, being handed over; the subscriber handles one message at
// a time, so lines stay in stream order.
const maxAckPending = 2

// pullExpiry bounds how long a pull request waits on the server. The
// iterator asks again when two of its heartbeats (half the expiry apart)
// are missed: a pull the server did not keep (seen under load after a
// redelivery: the consumer shows no waiting pull while the subscriber
// waits on it) then costs 5 s rather than the default 30 s.
const pullExpiry = 5 * time.Second

// Run copies messages until ctx is done or the reader is gone (an error
// wrapping ErrReaderGone). Messages still in doubt stay pending, kept from
// redelivery, until Settle.
func (s *Subscriber) Run(ctx context.Context, js jetstream.JetStream) error {
	cons, err := s.Consumer(ctx, js)
	if err != nil {
		return err
	}
	iter, err := cons.Messages(jetstream.PullMaxMessages(1), jetstream.PullExpiry(pullExpiry))
	if err != nil {
		return fmt.Errorf("consume %s: %w", s.Durable, err)
	}
	stop := context.AfterFunc(ctx, iter.Stop)
	defer stop()
	s.consuming.Store(true)
	defer s.consuming.Store(false)
	if s.Log != nil {
		s.Log.Info("consuming", "stream", s.Stream, "durable", s.Durable, "action", s.Action)
	}
	beat, stopBeat := context.WithCancel(context.Background())
	defer stopBeat()
	go s.heartbeat(beat)
	// A reader that goes while no message comes is noticed all the same:
	// what it had in doubt is handed back at once, not at the next message.
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if pipe := s.Pipe; pipe != nil {
		// Ended before Run returns: the caller sets Pipe for the next run.
		watched := make(chan struct{})
		defer func() { cancel(nil); <-watched }()
		go func() {
			defer close(watched)
			for runCtx.Err() == nil {
				if pipe.Gone() {
					cancel(ErrReaderGone)
					iter.Stop()
					return
				}
				select {
				case <-runCtx.Done():
				case <-time.After(200 * time.Millisecond):
				}
			}
		}()
	}
	var buf []byte
	for {
		msg, err := iter.Next()
		if err != nil {
			if cause := context.Cause(runCtx); errors.Is(cause, ErrReaderGone) {
				return fmt.Errorf("write lines: %w", cause)
			}
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			// The iterator asks again by itself: a consumer whose leader is
			// being elected (a cluster losing a node) misses heartbeats for
			// a while.
			if errors.Is(err, jetstream.ErrNoHeartbeat) {
				if s.Log != nil {
					s.Log.Warn("no heartbeat from the consumer; asking again", "durable", s.Durable)
				}
				continue
			}
			return fmt.Errorf("consume %s: %w", s.Durable, err)
		}
		if buf, err = s.handle(runCtx, msg, buf[:0]); err != nil {
			if cause := context.Cause(runCtx); errors.Is(cause, ErrReaderGone) {
				return fmt.Errorf("write lines: %w", cause)
			}
			return err
		}
	}
}

func (s *Subscriber) handle(ctx context.Context, msg jetstream.Msg, buf []byte) ([]byte, error) {
	meta, _ := msg.Metadata()
	b, err := Decode(msg.Headers(), msg.Data())
	if err != nil {
		// Redelivering it would not fix it: report and take it off this
		// consumer (it stays in the stream).
		if s.Log != nil {
			s.Log.Error("skipping a malformed message", "subject", msg.Subject(), "stream_seq", seqOf(meta), "err", err)
		}
		return buf, msg.Term()
	}
	if meta != nil && meta.NumDelivered > 1 {
		s.Redelivered++
		if s.Log != nil {
			s.Log.Info("delivered again: a reader may have had its tokens before", "stream_seq", seqOf(meta), "deliveries", meta.NumDelivered)
		}
	}
	// Each batch of the message is a line of its own (or several, of at
	// most MaxTokensPerLine tokens), as the collector wrote them.
	var keys []string
	for _, line := range b.Lines() {
		keep := line[:0]
		for _, t := range line {
			if s.Action != "" && t.Action != s.Action {
				continue
			}
			if s.Dedup != nil && s.Dedup.Contains(t.Key) {
				continue
			}
			if !s.JSON && (!wire.LineSafe(t.Email) || !wire.LineSafe(t.Login)) {
				// The sender would misparse the line: every other token of
				// it would be lost, or a crafted field would forge rows.
				if s.Log != nil {
					s.Log.Warn("token not written: its email or login holds a comma, CR, LF or NUL, or exceeds 254 bytes", "reason", "unsafe_field", "token_id", t.ID, "stream_seq", seqOf(meta))
				}
				continue
			}
			keep = append(keep, t)
			keys = append(keys, t.Key)
		}
		n := s.MaxTokensPerLine
		if n <= 0 {
			n = max(len(keep), 1)
		}
		for start := 0; start < len(keep); start += n {
			part := keep[start:min(start+n, len(keep))]
			if s.JSON {
				if buf, err = AppendJSON(buf, b.ID, part); err != nil {
					return buf, err
				}
			} else {
				buf = AppendLine(buf, part)
			}
			buf = append(buf, '\n')
		}
	}
	d := doubt{msg: msg, keys: keys}
	if len(buf) == 0 {
		// Nothing went out: nothing to doubt.
		s.ack(ctx, d)
		return buf, nil
	}
	s.mu.Lock()
	s.inDoubt = append(s.inDoubt, d)
	s.mu.Unlock()
	if _, err := s.Out.Write(buf); err != nil {
		if errors.Is(err, syscall.EPIPE) {
			err = ErrReaderGone
		}
		return buf, fmt.Errorf("write lines: %w", err)
	}
	if s.Pipe == nil {
		// The lines are out: only now may the server forget the message.
		s.ackDoubts(ctx, 0)
		return buf, nil
	}
	if err := s.Pipe.Taken(ctx); err != nil {
		return buf, fmt.Errorf("hand lines over: %w", err)
	}
	// The reader took this message: it is done with the one before.
	s.ackDoubts(ctx, 1)
	return buf, nil
}

// ackDoubts acknowledges the messages in doubt but the last keep.
func (s *Subscriber) ackDoubts(ctx context.Context, keep int) {
	s.mu.Lock()
	n := max(len(s.inDoubt)-keep, 0)
	done := s.inDoubt[:n:n]
	s.inDoubt = s.inDoubt[n:]
	s.mu.Unlock()
	for _, d := range done {
		s.ack(ctx, d)
	}
}

// ack tells the server d's message is done. An ack the server does not
// confirm (a cluster electing a leader) is not fatal: the message comes
// again after AckWait, and the dedup window (or the consumer of the lines)
// drops what was written twice.
func (s *Subscriber) ack(ctx context.Context, d doubt) {
	s.Acked++
	if err := d.msg.DoubleAck(ctx); err != nil && ctx.Err() == nil && s.Log != nil {
		meta, _ := d.msg.Metadata()
		s.Log.Warn("ack not confirmed; the message will be delivered again", "stream_seq", seqOf(meta), "err", err)
	}
	if s.Dedup != nil {
		for _, k := range d.keys {
			s.Dedup.Seen(k)
		}
	}
}

// heartbeat keeps the messages in doubt from being redelivered while the
// subscriber waits for its reader, or for the next message.
func (s *Subscriber) heartbeat(ctx context.Context) {
	every := s.AckWait / 3
	if every <= 0 {
		every = 10 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		for _, d := range s.inDoubt {
			d.msg.InProgress()
		}
		s.mu.Unlock()
	}
}

// Settle ends the doubt about the messages whose lines a reader may have
// had: processed (the reader said so, exiting 0 after the end of its
// input) acknowledges them, otherwise they are delivered again at once. It
// returns how many were handed back.
func (s *Subscriber) Settle(ctx context.Context, processed bool) int {
	s.mu.Lock()
	doubts := s.inDoubt
	s.inDoubt = nil
	s.mu.Unlock()
	for _, d := range doubts {
		if processed {
			s.ack(ctx, d)
		} else {
			d.msg.Nak()
		}
	}
	if processed {
		return 0
	}
	return len(doubts)
}

func seqOf(m *jetstream.MsgMetadata) uint64 {
	if m == nil {
		return 0
	}
	return m.Sequence.Stream
}

// SeedFromOutput fills a window with the Keys of the tokens found in the
// last lines of an earlier run's output (collector lines or json lines), so
// that a restarted subscriber writing to the same file does not repeat the
// batch it wrote but could not acknowledge.
func SeedFromOutput(r io.ReaderAt, size int64, window *Dedup[string]) error {
	const maxTail = 64 << 20
	off := max(size-maxTail, 0)
	data := make([]byte, size-off)
	if _, err := r.ReadAt(data, off); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read earlier output: %w", err)
	}
	// Oldest first, so that a full window keeps the newest tokens. A last
	// line without its newline was cut short and is not trusted.
	lines := strings.Split(string(data), "\n")
	for _, line := range lines[:len(lines)-1] {
		tokens, err := DecodeLine(line)
		if err != nil {
			b, jerr := decodeJSON([]byte(line))
			if jerr != nil {
				continue
			}
			tokens = b.Tokens
		}
		for _, t := range tokens {
			if key, err := token.KeyOf(t.Token); err == nil {
				window.Seen(key)
			}
		}
	}
	return nil
}
