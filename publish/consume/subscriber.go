package consume

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/mailroom/tailer/publish/wire"
	"github.com/nats-io/nats.go/jetstream"
)

// Subscriber copies batches from a durable JetStream consumer to a writer as
// lines, acknowledging each message only after its lines were written, so a
// crash of either side redelivers rather than loses.
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
	Log *slog.Logger
	// AckWait is how long the server waits for an ack before redelivering.
	AckWait time.Duration
}

// Consumer creates or looks up the durable consumer.
func (s *Subscriber) Consumer(ctx context.Context, js jetstream.JetStream) (jetstream.Consumer, error) {
	cons, err := js.Consumer(ctx, s.Stream, s.Durable)
	if err == nil {
		return cons, nil
	}
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("consumer %s on stream %s: %w", s.Durable, s.Stream, err)
	}
	filters := []string{s.Subject, s.Subject + ".>"}
	if s.Action != "" {
		// Batches on the base subject mix actions (filtered here, token by
		// token); with a subject per action only the wanted one is read.
		filters = []string{s.Subject, s.Subject + "." + s.Action}
	}
	deliver := jetstream.DeliverNewPolicy
	if s.FromStart {
		deliver = jetstream.DeliverAllPolicy
	}
	ackWait := s.AckWait
	if ackWait <= 0 {
		ackWait = 30 * time.Second
	}
	cons, err = js.CreateConsumer(ctx, s.Stream, jetstream.ConsumerConfig{
		Durable:        s.Durable,
		Description:    "tailer subscribe",
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        ackWait,
		DeliverPolicy:  deliver,
		FilterSubjects: filters,
		// One batch at a time keeps lines in stream order.
		MaxAckPending: 1,
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer %s on stream %s: %w", s.Durable, s.Stream, err)
	}
	return cons, nil
}

// Run copies messages until ctx is done.
func (s *Subscriber) Run(ctx context.Context, js jetstream.JetStream) error {
	cons, err := s.Consumer(ctx, js)
	if err != nil {
		return err
	}
	iter, err := cons.Messages(jetstream.PullMaxMessages(1))
	if err != nil {
		return fmt.Errorf("consume %s: %w", s.Durable, err)
	}
	stop := context.AfterFunc(ctx, iter.Stop)
	defer stop()
	if s.Log != nil {
		s.Log.Info("consuming", "stream", s.Stream, "durable", s.Durable, "action", s.Action)
	}
	var buf []byte
	for {
		msg, err := iter.Next()
		if err != nil {
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
		if buf, err = s.handle(ctx, msg, buf[:0]); err != nil {
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
	keep := b.Tokens[:0]
	for _, t := range b.Tokens {
		if s.Action != "" && t.Action != s.Action {
			continue
		}
		if s.Dedup != nil && s.Dedup.Contains(t.Key) {
			continue
		}
		if !s.JSON && (!wire.LineSafe(t.Email) || !wire.LineSafe(t.Login)) {
			// The sender would misparse the line: every other token of it
			// would be lost, or a crafted field would forge rows.
			if s.Log != nil {
				s.Log.Warn("token not written: its email or login holds a comma, CR, LF or NUL, or exceeds 254 bytes", "reason", "unsafe_field", "token_id", t.ID, "stream_seq", seqOf(meta))
			}
			continue
		}
		keep = append(keep, t)
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
	if len(buf) > 0 {
		if _, err := s.Out.Write(buf); err != nil {
			return buf, fmt.Errorf("write lines: %w", err)
		}
	}
	if s.Dedup != nil {
		for _, t := range keep {
			s.Dedup.Seen(t.Key)
		}
	}
	// The lines are out: only now may the server forget the message. An
	// ack the server does not confirm (a cluster electing a leader) is not
	// fatal: the message comes again after AckWait, and the dedup window
	// (or the consumer of the lines) drops what was written twice.
	if err := msg.DoubleAck(ctx); err != nil && ctx.Err() == nil && s.Log != nil {
		s.Log.Warn("ack not confirmed; the message will be delivered again", "stream_seq", seqOf(meta), "err", err)
	}
	return buf, nil
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
			if key, err := wire.KeyOf(t.Token); err == nil {
				window.Seen(key)
			}
		}
	}
	return nil
}
