package replication

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// readBuffer is the most one read of the replication socket takes.
const readBuffer = 256 << 10

// StreamOptions choose how pgoutput encodes the stream.
type StreamOptions struct {
	Slot        string
	Publication string
	// ProtoVersion is the pgoutput protocol: 1, or 2 for streaming of large
	// in-progress transactions (PostgreSQL 14+).
	ProtoVersion int
	// Binary asks for binary column values (PostgreSQL 14+), which the
	// walsender produces more cheaply than text.
	Binary bool
	// Messages asks for logical messages (PostgreSQL 14+): the tailer's
	// heartbeats come through them.
	Messages bool
	// StatusInterval is how often a standby status update is sent even when
	// nothing changed; it must stay well below wal_sender_timeout.
	StatusInterval time.Duration
	// OnStatus, if set, is told every position reported as flushed.
	OnStatus func(confirmed pglogrepl.LSN)
	// BeforeConfirm, if set, is asked before a position past any it
	// allowed before (or past Confirmed) is reported as flushed: the
	// position is reported only once it returned nil, and until then the
	// last one it allowed is (Lease.SetConfirmLimit writes it down first).
	// It returns how far positions are allowed from then on (at least
	// confirmed): a caller that writes the limit down ahead of confirmed
	// is not asked again for each position within it.
	BeforeConfirm func(ctx context.Context, confirmed pglogrepl.LSN) (pglogrepl.LSN, error)
	// Confirmed is the slot's confirmed position as the stream starts,
	// which BeforeConfirm need not be asked for.
	Confirmed pglogrepl.LSN
	// Timeout is how long the server may stay silent (no message and no
	// keepalive) while the stream is read before the connection is given
	// up as dead; after half of it the server is asked for a reply. A
	// half-open TCP connection otherwise goes unnoticed until the kernel
	// gives up retransmitting, about 15 minutes, while the slot looks held.
	// Default 60s.
	Timeout time.Duration
}

// ErrSilent is returned by Run when the server sent nothing for
// Options.Timeout, not even an answer to a status update asking for one.
var ErrSilent = errors.New("replication connection silent")

func (o StreamOptions) pluginArgs() []string {
	args := []string{
		fmt.Sprintf("proto_version '%d'", o.ProtoVersion),
		fmt.Sprintf("publication_names '%s'", o.Publication),
	}
	if o.Binary {
		args = append(args, "binary 'true'")
	}
	if o.Messages {
		args = append(args, "messages 'true'")
	}
	if o.ProtoVersion >= 2 {
		args = append(args, "streaming 'on'")
	}
	return args
}

// Handler consumes the stream. Every method is called from the goroutine
// running Receiver.Run.
type Handler interface {
	// Data handles one pgoutput message; data is only valid during the
	// call.
	Data(data []byte) error
	// ServerPosition reports a keepalive's WAL position: every change
	// before it has been sent.
	ServerPosition(lsn pglogrepl.LSN)
	// Deadline returns when Tick must next be called, or the zero time.
	Deadline() time.Time
	// Tick is called once Deadline has passed.
	Tick(now time.Time) error
	// Wait applies backpressure: it returns true when the handler can take
	// more data, or false at the latest at until, so that status updates
	// keep flowing while it cannot.
	Wait(ctx context.Context, until time.Time) (bool, error)
	// Confirmable returns the position to report as flushed.
	Confirmable() pglogrepl.LSN
	// Stop is called once, when Run's context is done, before the final
	// status update: the handler finishes what it holds (bounded in time).
	Stop()
}

// Receiver is a started replication stream.
type Receiver struct {
	conn *pgconn.PgConn
	opts StreamOptions

	received pglogrepl.LSN
	sent     pglogrepl.LSN
	lastSent time.Time
	// allowed is the furthest position BeforeConfirm allowed.
	allowed pglogrepl.LSN
}

// Start begins streaming the slot from its confirmed position.
func Start(ctx context.Context, conn *pgconn.PgConn, opts StreamOptions) (*Receiver, error) {
	if err := ValidateName(opts.Slot); err != nil {
		return nil, fmt.Errorf("slot name: %w", err)
	}
	if err := ValidateName(opts.Publication); err != nil {
		return nil, fmt.Errorf("publication name: %w", err)
	}
	if opts.ProtoVersion == 0 {
		opts.ProtoVersion = 2
	}
	if opts.StatusInterval <= 0 {
		opts.StatusInterval = time.Second
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 60 * time.Second
	}
	// Start position 0 lets the server resume from the slot's
	// confirmed_flush_lsn.
	err := pglogrepl.StartReplication(ctx, conn, opts.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: opts.pluginArgs(),
	})
	if err != nil {
		return nil, fmt.Errorf("start replication on slot %s: %w", opts.Slot, err)
	}
	return &Receiver{conn: conn, opts: opts, allowed: opts.Confirmed}, nil
}

// minStatusGap bounds how often a moved confirmed position is reported.
const minStatusGap = 50 * time.Millisecond

// Run reads the stream until ctx is done or the connection fails. When ctx
// is done it calls h.Stop, sends a last status update and returns ctx's
// error.
func (r *Receiver) Run(ctx context.Context, h Handler) error {
	netConn := r.conn.Conn()
	ending, stopWake := wakeOnDone(ctx, netConn)
	defer stopWake()
	var (
		nextStatus  time.Time
		curDeadline time.Time
		// heard is when the server was last heard from, or when reading
		// last resumed after backpressure (the server is not silent while
		// the tailer does not read); pinged is set once a reply was asked
		// for since then.
		heard  = time.Now()
		pinged bool
	)
	for {
		if ctx.Err() != nil {
			return r.end(ctx, h, ending)
		}
		now := time.Now()
		silent := now.Sub(heard)
		if silent >= r.opts.Timeout {
			return fmt.Errorf("%w: nothing from the server for %s, not even a reply to a status update that asked for one", ErrSilent, silent.Round(time.Millisecond))
		}
		ping := !pinged && silent >= r.opts.Timeout/2
		if c := h.Confirmable(); ping || !now.Before(nextStatus) || (c > r.sent && now.Sub(r.lastSent) >= minStatusGap) {
			if err := r.sendStatus(c, ping); err != nil {
				return err
			}
			pinged = pinged || ping
			nextStatus = now.Add(r.opts.StatusInterval)
		}
		ready, err := h.Wait(ctx, nextStatus)
		if err != nil {
			return err
		}
		if !ready {
			heard, pinged = time.Now(), false
			continue
		}
		deadline, ticked, err := readDeadline(h, now, nextStatus)
		if err != nil {
			return err
		}
		if ticked {
			continue
		}
		if !deadline.Equal(curDeadline) {
			netConn.SetReadDeadline(deadline)
			curDeadline = deadline
		}
		msg, err := r.conn.ReceiveMessage(context.Background())
		if err != nil {
			var netErr net.Error
			if errors.As(err, &netErr) && netErr.Timeout() {
				// The wake-up may have moved the deadline.
				curDeadline = time.Time{}
				continue
			}
			return fmt.Errorf("receive replication message: %w", err)
		}
		heard, pinged = time.Now(), false
		if err := r.handleMessage(msg, h, &nextStatus); err != nil {
			return err
		}
	}
}

// wakeOnDone pulls conn's read deadline in once ctx is done: a read
// blocked in ReceiveMessage wakes up at its deadline, which is how
// cancellation reaches it without a context watcher goroutine per
// message. Once ending is called the stream is being ended, and the
// wake-up must not cut the exchange that ends it.
func wakeOnDone(ctx context.Context, conn net.Conn) (ending func(), stop func() bool) {
	var (
		mu    sync.Mutex
		ended bool
	)
	stop = context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !ended {
			conn.SetReadDeadline(time.Now())
		}
	})
	return func() { mu.Lock(); ended = true; mu.Unlock() }, stop
}

// readDeadline is when the next read must give up: the next status
// update, or the open batch's timeout if that comes first. A timeout
// already past is handled at once (ticked).
func readDeadline(h Handler, now, nextStatus time.Time) (deadline time.Time, ticked bool, err error) {
	deadline = nextStatus
	if d := h.Deadline(); !d.IsZero() {
		if !now.Before(d) {
			return deadline, true, h.Tick(now)
		}
		if d.Before(deadline) {
			deadline = d
		}
	}
	return deadline, false, nil
}

// end stops h, sends the last status update and ends the copy, once ctx
// is done; ending is called before the exchange that ends the stream,
// which the read deadline's wake-up must not cut.
func (r *Receiver) end(ctx context.Context, h Handler, ending func()) error {
	h.Stop()
	if err := r.sendStatus(h.Confirmable(), false); err != nil {
		return fmt.Errorf("final status update: %w", err)
	}
	ending()
	// Failing to end the stream loses nothing: the update is sent; at
	// worst the server applies it a moment later or, were the connection
	// lost, the next session reads again what was published and skips it,
	// as after a crash.
	r.endCopy()
	return ctx.Err()
}

// handleMessage handles one message of the server's.
func (r *Receiver) handleMessage(msg pgproto3.BackendMessage, h Handler, nextStatus *time.Time) error {
	switch m := msg.(type) {
	case *pgproto3.CopyData:
		return r.copyData(m.Data, h, nextStatus)
	case *pgproto3.ErrorResponse:
		return fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(m))
	case *pgproto3.NoticeResponse:
		// PostgreSQL 18 decodes on past a publication that did not exist
		// at a change's point in the WAL, warning "skipped loading
		// publication" and leaving the change out, where 15-17 stop with
		// an error. The change may be a token: stop as they do, before the
		// transaction's commit is confirmed.
		if notice := pgconn.ErrorResponseToPgError((*pgproto3.ErrorResponse)(m)); IsPublicationGone(notice) {
			return fmt.Errorf("replication stream: %w", notice)
		}
	case *pgproto3.CopyDone:
		return errors.New("replication stream: server ended the stream")
	}
	return nil
}

func (r *Receiver) copyData(data []byte, h Handler, nextStatus *time.Time) error {
	if len(data) == 0 {
		return errors.New("replication stream: empty CopyData")
	}
	switch data[0] {
	case pglogrepl.XLogDataByteID:
		// walStart(8) walEnd(8) sendTime(8) then the pgoutput message.
		if len(data) < 25 {
			return errors.New("replication stream: short XLogData")
		}
		if start := pglogrepl.LSN(binary.BigEndian.Uint64(data[1:])); start > r.received {
			r.received = start
		}
		if err := h.Data(data[25:]); err != nil {
			return fmt.Errorf("at %s: %w", r.received, err)
		}
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		// walEnd(8) sendTime(8) replyRequested(1).
		if len(data) < 18 {
			return errors.New("replication stream: short keepalive")
		}
		walEnd := pglogrepl.LSN(binary.BigEndian.Uint64(data[1:]))
		if walEnd > r.received {
			r.received = walEnd
		}
		h.ServerPosition(walEnd)
		if data[17] != 0 {
			// The server is about to time us out: answer now.
			*nextStatus = time.Time{}
		}
	}
	return nil
}

// endCopyTimeout bounds the wait for the server to end the stream.
const endCopyTimeout = 5 * time.Second

// endCopy ends the stream as the protocol does (CopyDone both ways). The
// server reads the client's messages in order, so once it answers, the
// last status update has moved the slot: a tailer that has stopped has its
// position on the slot, for tailer status and for the next owner alike,
// not in a socket buffer the walsender has yet to read. Data the server
// sent meanwhile is dropped unconfirmed.
func (r *Receiver) endCopy() {
	r.conn.Conn().SetReadDeadline(time.Now().Add(endCopyTimeout))
	pglogrepl.SendStandbyCopyDone(context.Background(), r.conn)
}

// sendStatus reports confirmed as flushed and applied. Every position is
// given explicitly: pglogrepl fills a zero flush position with the write
// position, which would confirm data not yet published.
func (r *Receiver) sendStatus(confirmed pglogrepl.LSN, reply bool) error {
	confirmed = r.allow(confirmed)
	if confirmed == 0 {
		// Nothing known yet; a zero flush would be replaced by the write
		// position, so say nothing.
		return nil
	}
	write := r.received
	if write < confirmed {
		write = confirmed
	}
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), r.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: write,
		WALFlushPosition: confirmed,
		WALApplyPosition: confirmed,
		ClientTime:       time.Now(),
		ReplyRequested:   reply,
	})
	if err != nil {
		return fmt.Errorf("send standby status: %w", err)
	}
	r.sent, r.lastSent = confirmed, time.Now()
	if r.opts.OnStatus != nil {
		r.opts.OnStatus(confirmed)
	}
	return nil
}

// allow is the furthest of confirmed that BeforeConfirm allows: confirmed
// itself once it said yes, else the last it allowed. A no is not the
// stream's failure: the status still goes out, at the allowed position,
// and the next asks again.
func (r *Receiver) allow(confirmed pglogrepl.LSN) pglogrepl.LSN {
	if r.opts.BeforeConfirm == nil || confirmed <= r.allowed {
		return confirmed
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.opts.StatusInterval*5)
	defer cancel()
	upTo, err := r.opts.BeforeConfirm(ctx, confirmed)
	if err != nil {
		return r.allowed
	}
	r.allowed = max(upTo, confirmed)
	return confirmed
}

// Sent returns the last position reported as flushed.
func (r *Receiver) Sent() pglogrepl.LSN { return r.sent }
