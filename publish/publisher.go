package publish

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/decoder"
)

// Stream describes where batches go.
type Stream struct {
	Name    string
	Subject string
	// Duplicates is JetStream's duplicate window for Nats-Msg-Id, and
	// Replicas the number of copies; both only apply when the stream is
	// created.
	Duplicates time.Duration
	Replicas   int
}

// Publisher sends batches to one JetStream stream, chaining each message to
// the previous one with Nats-Expected-Last-Msg-Id: a batch whose predecessor
// did not land is refused, so pipelined publishes can never leave a gap that
// a later batch hides.
type Publisher struct {
	js      jetstream.JetStream
	stream  jetstream.Stream
	subject string

	lastID  string
	lastPos decoder.Position
}

// NewPublisher connects to the stream, creating it (file storage) if it does
// not exist, and reads its last message to learn what was published before.
func NewPublisher(ctx context.Context, nc *nats.Conn, cfg Stream) (*Publisher, error) {
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
	if !slices.Contains(info.Config.Subjects, cfg.Subject) {
		return nil, fmt.Errorf("stream %s does not take subject %s (its subjects: %v)", cfg.Name, cfg.Subject, info.Config.Subjects)
	}
	p := &Publisher{js: js, stream: stream, subject: cfg.Subject}
	if err := p.readLast(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// readLast loads the id and position of the stream's last message.
func (p *Publisher) readLast(ctx context.Context) error {
	info, err := p.stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("stream info: %w", err)
	}
	if info.State.LastSeq == 0 {
		return nil
	}
	msg, err := p.stream.GetMsg(ctx, info.State.LastSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		// Removed by retention: nothing to chain to or compare with.
		return nil
	}
	if err != nil {
		return fmt.Errorf("read last message of stream: %w", err)
	}
	p.lastID = msg.Header.Get(HeaderMsgID)
	if s := msg.Header.Get(HeaderPosLast); s != "" {
		if p.lastPos, err = decoder.ParsePosition(s); err != nil {
			return fmt.Errorf("last message of stream (seq %d): %s: %w", msg.Sequence, HeaderPosLast, err)
		}
	}
	return nil
}

// LastPosition is the WAL position of the last token the stream holds; every
// token at or before it was published (or skipped) by an earlier run.
func (p *Publisher) LastPosition() decoder.Position { return p.lastPos }

// Message is one batch ready to send.
type Message struct {
	First, Last decoder.Position
	Count       int
	TokenIDs    string
	Format      Format
	Body        []byte
}

// PublishAsync sends m and returns the future of its PubAck. Futures
// complete in publishing order.
func (p *Publisher) PublishAsync(m *Message) (jetstream.PubAckFuture, error) {
	id := BatchID(m.First, m.Last)
	msg := &nats.Msg{
		Subject: p.subject,
		Data:    m.Body,
		Header: nats.Header{
			HeaderCount:    {strconv.Itoa(m.Count)},
			HeaderTokenIDs: {m.TokenIDs},
			HeaderPosFirst: {m.First.String()},
			HeaderPosLast:  {m.Last.String()},
			HeaderFormat:   {m.Format.String()},
		},
	}
	opts := []jetstream.PublishOpt{jetstream.WithMsgID(id)}
	if p.lastID != "" {
		opts = append(opts, jetstream.WithExpectLastMsgID(p.lastID))
	}
	fut, err := p.js.PublishMsgAsync(msg, opts...)
	if err != nil {
		return nil, fmt.Errorf("publish batch %s: %w", id, err)
	}
	p.lastID, p.lastPos = id, m.Last
	return fut, nil
}
