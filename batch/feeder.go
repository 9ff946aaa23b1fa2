package batch

import (
	"cmp"
	"context"
	"errors"
	"github.com/mailroom/tailer/decoder/wal"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/mailroom/tailer/decoder"
)

// ErrPipelineStopped is returned when the consumer of batches is gone.
var ErrPipelineStopped = errors.New("batch pipeline stopped")

// Feeder sits on the replication goroutine: it decodes each pgoutput
// message, cuts batches and hands them to the publishing side over a
// bounded channel, and answers which position may be confirmed. It
// satisfies replication.Handler.
type Feeder struct {
	dec     *decoder.Decoder
	batcher *Batcher
	tracker *Tracker
	out     chan *Batch
	// stalled holds cut batches the publishing side had no room for yet,
	// oldest first.
	stalled []*Batch
	done    [MaxLanes]atomic.Uint64
	read    [MaxLanes]atomic.Uint64
	// confirmedAt is Tracker.ConfirmedAt as of the last Confirmable (Unix
	// ns), for other goroutines.
	confirmedAt atomic.Int64
	drained     <-chan struct{}

	onBadRow    func(wal.Position, error)
	stopTimeout time.Duration
}

// FeederConfig configures a Feeder.
type FeederConfig struct {
	Limit   int
	Timeout time.Duration
	// Start is the slot's confirmed position when streaming began.
	Start pglogrepl.LSN
	// Depth is how many cut batches may wait for the publishing side.
	Depth int
	// Drained is closed when the publishing side has stopped; Stop waits
	// for it so that the final status update covers everything published.
	Drained <-chan struct{}
	// OnBadRow is told about rows that could not be decoded.
	OnBadRow func(wal.Position, error)
	// StopTimeout bounds how long Stop waits for the last batches.
	StopTimeout time.Duration
	Now         func() time.Time
	// ByAction gives each action a lane (and batches) of its own.
	ByAction bool
	// SpillDir is where large streamed transactions are buffered until
	// their commit (os.TempDir() when empty).
	SpillDir string
	// Schema is the tokens table's ("" is public): inserts into a table
	// tokens of any other schema are no tokens.
	Schema string
}

// handoverChunk is how many rows of a committed streamed transaction are cut
// into batches before the Feeder waits for the publishing side again: a
// transaction of a million tokens must not become a thousand batches
// waiting in memory.
const handoverChunk = 4096

// NewFeeder returns a Feeder decoding inserts into the tokens table of
// cfg.Schema.
func NewFeeder(cfg FeederConfig) *Feeder {
	if cfg.Depth <= 0 {
		cfg.Depth = 4
	}
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = 10 * time.Second
	}
	batcher := NewBatcher(cfg.Limit, cfg.Timeout, cfg.Now)
	if cfg.ByAction {
		batcher.SetLanes(ByAction)
	}
	dec := decoder.New(cmp.Or(cfg.Schema, "public"), "tokens")
	dec.SpillDir, dec.HandoverChunk = cfg.SpillDir, handoverChunk
	return &Feeder{
		dec:         dec,
		batcher:     batcher,
		tracker:     NewTracker(cfg.Start),
		out:         make(chan *Batch, cfg.Depth),
		drained:     cfg.Drained,
		onBadRow:    cfg.OnBadRow,
		stopTimeout: cfg.StopTimeout,
	}
}

// Batches is where cut batches come out, in order. It is closed by Stop.
func (f *Feeder) Batches() <-chan *Batch { return f.out }

// MarkDone records that b and every batch before it are published or
// skipped, and recycles b. Call it from the publishing side, in order.
func (f *Feeder) MarkDone(b *Batch) {
	f.done[b.Lane].Store(b.LastSeq)
	f.batcher.Recycle(b)
}

// decoderSink is the Feeder seen as the decoder's decoder.Sink: the same
// memory (a conversion, no allocation per message) with methods of its own,
// so that Token, BadRow and Commit are not part of the Feeder's API.
type decoderSink Feeder

func (s *decoderSink) Token(t *decoder.Token) {
	f := (*Feeder)(s)
	full := f.batcher.Add(t)
	for l, seq := range f.batcher.LastSeqs() {
		f.read[l].Store(seq)
	}
	if full != nil {
		f.handoff(full)
	}
}

func (s *decoderSink) BadRow(pos wal.Position, err error) {
	if s.onBadRow != nil {
		s.onBadRow(pos, err)
	}
}

func (s *decoderSink) Commit(_, end pglogrepl.LSN, at time.Time) {
	f := (*Feeder)(s)
	f.tracker.Mark(end, f.batcher.LastSeqs(), at)
}

func (s *decoderSink) Heartbeat(lsn pglogrepl.LSN, at time.Time) {
	f := (*Feeder)(s)
	f.tracker.Mark(lsn, f.batcher.LastSeqs(), at)
}

// handoff passes b on, or queues it as stalled when the channel is full (or
// older batches wait); Wait then holds off further reads until they fit.
func (f *Feeder) handoff(b *Batch) {
	if len(f.stalled) == 0 {
		select {
		case f.out <- b:
			return
		default:
		}
	}
	f.stalled = append(f.stalled, b)
}

// Data decodes one pgoutput message.
func (f *Feeder) Data(data []byte) error { return f.dec.Decode(data, (*decoderSink)(f)) }

// ServerPosition records a keepalive position.
func (f *Feeder) ServerPosition(lsn pglogrepl.LSN) {
	// A keepalive's time says nothing of when the WAL before its position
	// was written: a walsender stuck in a large transaction sends old
	// positions at new times.
	f.tracker.Mark(lsn, f.batcher.LastSeqs(), time.Time{})
}

// Deadline is when the open batch times out.
func (f *Feeder) Deadline() time.Time {
	d, _ := f.batcher.Deadline()
	return d
}

// Tick cuts the open batches whose timeout has passed.
func (f *Feeder) Tick(now time.Time) error {
	var buf [MaxLanes]*Batch
	for _, b := range f.batcher.CutExpired(now, buf[:0]) {
		f.handoff(b)
	}
	return nil
}

// Wait blocks while cut batches wait for room, at most until until. It also
// goes on handing over a committed streamed transaction, a chunk at a time,
// so that the batches it makes never wait in memory all at once.
func (f *Feeder) Wait(ctx context.Context, until time.Time) (bool, error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		for len(f.stalled) > 0 {
			if timer == nil {
				timer = time.NewTimer(time.Until(until))
			}
			select {
			case f.out <- f.stalled[0]:
				f.stalled = f.stalled[1:]
			case <-f.drained:
				return false, ErrPipelineStopped
			case <-timer.C:
				return false, nil
			case <-ctx.Done():
				return false, nil
			}
		}
		if !f.dec.PartlyHandedOver() {
			return true, nil
		}
		if _, err := f.dec.Continue((*decoderSink)(f)); err != nil {
			return false, err
		}
	}
}

// Confirmable is the newest position whose every token is done.
func (f *Feeder) Confirmable() pglogrepl.LSN {
	var done Seqs
	for l := range done {
		done[l] = f.done[l].Load()
	}
	c := f.tracker.Confirmable(done)
	if at := f.tracker.ConfirmedAt(); !at.IsZero() {
		f.confirmedAt.Store(at.UnixNano())
	}
	return c
}

// ConfirmedAt is the newest commit or heartbeat time known to lie before
// the position Confirmable last returned (zero when none is known yet). It
// is safe to call from any goroutine.
func (f *Feeder) ConfirmedAt() time.Time {
	if ns := f.confirmedAt.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// Stop cuts the open batch, hands over what is left, closes Batches and
// waits (bounded) until the publishing side has finished them.
func (f *Feeder) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), f.stopTimeout)
	defer cancel()
	for _, b := range f.batcher.CutAll(CutShutdown, f.stalled) {
		select {
		case f.out <- b:
		case <-f.drained:
		case <-ctx.Done():
		}
	}
	f.stalled = nil
	close(f.out)
	select {
	case <-f.drained:
	case <-ctx.Done():
	}
}

// Close releases what the decoder buffered for streamed transactions.
func (f *Feeder) Close() { f.dec.Close() }

// PendingTokens is the number of tokens read from the WAL and not yet
// published or skipped. It is safe to call from any goroutine.
func (f *Feeder) PendingTokens() uint64 {
	var n uint64
	for l := range f.done {
		// done first: it never passes what had been read when it was
		// stored.
		done := f.done[l].Load()
		n += f.read[l].Load() - done
	}
	return n
}
