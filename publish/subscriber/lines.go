package subscriber

import (
	"bufio"
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

	"github.com/mailroom/tailer/publish/subscriber/protocol"
	"github.com/mailroom/tailer/publish/wire"
)

// Lines is the Sink that hands batches on as lines (collector lines, or
// JSON) to a reader. A batch is done once its lines are out of reach of a
// crash:
//   - written, when Out is a file (neither Pipe nor Reports);
//   - taken by the reader of the pipe Out, and followed by the next batch
//     (Pipe): a reader that reads its pipe line by line, and reads more
//     only when it is done with what it holds, has then finished it;
//   - reported finished by the reader, line by line (Reports, see
//     ReadReports): for readers that read ahead.
type Lines struct {
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
	// Out receives the lines.
	Out io.Writer
	// Pipe, when set, is Out as the write end of a pipe: batches are
	// written one at a time, each once the reader has taken the one
	// before, which is then done. The last batch taken, and the one being
	// handed over, are in doubt: kept from redelivery while the subscriber
	// runs, and settled by Subscriber.ReaderEnded when the reader ends.
	Pipe *Pipe
	// Reports says the reader reports each line it finished (ReadReports):
	// only reported lines are done, however far ahead the reader reads.
	Reports bool
	Log     *slog.Logger

	// mu makes one step of the book at a time (step): what the reader
	// was handed and what its words finish, touched by its Step alone.
	mu   sync.Mutex
	book protocol.ReaderBook
	// done is the Subscriber's, given with the units; out is Out and
	// Pipe as SetOut set them last (nil: the fields as configured).
	done atomic.Pointer[func(...*Unit)]
	out  atomic.Pointer[outlet]
}

// outlet is where the lines go: Out, and Pipe when Out is a pipe's
// write end.
type outlet struct {
	out  io.Writer
	pipe *Pipe
}

// lined is a unit as lines.
type lined struct {
	u    *Unit
	data []byte
	keys []string
	// h is the unit as the book keeps it.
	h *protocol.Handout
}

// reportsAckPending is how many messages a reader that reports may hold:
// it reads ahead, and each message is acknowledged only once all its
// lines are reported. A pipe's reader holds two: the last message taken,
// and the next, being handed over.
const reportsAckPending = 64

// Pulls takes one message at a time, so that lines stay in stream order.
func (l *Lines) Pulls() (pull, pending int) {
	if l.Reports {
		return 1, reportsAckPending
	}
	return 1, 2
}

// serial: a pipe's reader that does not report says it finished a batch
// only by taking the next.
func (l *Lines) serial() bool { return l.CurrentPipe() != nil && !l.Reports }

// CurrentPipe is the pipe the lines go to now (nil: Out is not a pipe).
func (l *Lines) CurrentPipe() *Pipe { return l.outlet().pipe }

// outlet is where the lines go now.
func (l *Lines) outlet() outlet {
	if o := l.out.Load(); o != nil {
		return *o
	}
	return outlet{l.Out, l.Pipe}
}

// SetOut replaces Out and Pipe (nil when out is not a pipe): a sender
// started again gets a pipe of its own. The fields keep what Lines was
// made with (a health check may read the outlet meanwhile); CurrentPipe
// is the pipe set last.
func (l *Lines) SetOut(out io.Writer, pipe *Pipe) {
	l.out.Store(&outlet{out, pipe})
	l.step(protocol.NewReader{At: time.Now()})
}

// step steps the book with e; the tokens of what it says is done are
// then in the dedup window (Dedup is not safe for concurrent use: it is
// read and written under mu).
func (l *Lines) step(e protocol.ReaderFound) []protocol.ReaderToDo {
	l.mu.Lock()
	defer l.mu.Unlock()
	cmds := l.book.Step(e)
	for _, c := range cmds {
		var done []*protocol.Handout
		switch c := c.(type) {
		case protocol.OutsDone:
			done = c.Outs
		case protocol.Settled:
			done = c.Done
		}
		for _, h := range done {
			if l.Dedup != nil {
				for _, k := range h.Unit.(*lined).keys {
					l.Dedup.Seen(k)
				}
			}
		}
	}
	return cmds
}

// rendered are the units of us with lines for the reader, and those
// without (render).
func (l *Lines) rendered(us []*Unit) (ls []*lined, none []*Unit) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, u := range us {
		if x := l.render(u); x != nil {
			ls = append(ls, x)
		} else {
			none = append(none, u)
		}
	}
	return ls, none
}

// Hand writes us to the reader as Out's kind asks.
func (l *Lines) Hand(ctx context.Context, us []*Unit, done func(...*Unit)) error {
	l.done.Store(&done)
	ls, none := l.rendered(us)
	if len(none) > 0 {
		// Nothing of them for this reader: done as they are.
		done(none...)
	}
	switch {
	case l.Reports:
		// The reader says what it finished: write all, it may read ahead.
		var buf []byte
		for _, x := range ls {
			buf = append(buf, x.data...)
		}
		l.step(protocol.Handing{Outs: handouts(ls), Reports: true})
		return l.write(buf)
	case l.CurrentPipe() != nil:
		return l.handPipe(ctx, ls)
	default:
		var buf []byte
		for _, x := range ls {
			buf = append(buf, x.data...)
		}
		l.step(protocol.Handing{Outs: handouts(ls)})
		if err := l.write(buf); err != nil {
			return err
		}
		// The lines are out: only now may the server forget them.
		l.finish(l.step(protocol.Through{Outs: handouts(ls)}))
		return nil
	}
}

// handouts are ls as the book keeps them.
func handouts(ls []*lined) []*protocol.Handout {
	hs := make([]*protocol.Handout, len(ls))
	for i, x := range ls {
		hs[i] = x.h
	}
	return hs
}

// handPipe writes ls to the pipe one at a time: once the reader took one,
// it is done with those before.
func (l *Lines) handPipe(ctx context.Context, ls []*lined) error {
	pipe := l.CurrentPipe()
	for _, x := range ls {
		if err := ctx.Err(); err != nil {
			// Stopping, or the reader went: hand it nothing more.
			return fmt.Errorf("hand lines over: %w", err)
		}
		l.step(protocol.Handing{Outs: []*protocol.Handout{x.h}})
		if n, err := l.writeSome(x.data); err != nil {
			// What did not reach the pipe (a reader gone: EPIPE) was not
			// written, and its reader cannot have taken it whole.
			l.step(protocol.WriteCut{Unwritten: len(x.data) - n})
			return err
		}
		if err := pipe.Taken(ctx); err != nil {
			return fmt.Errorf("hand lines over: %w", err)
		}
		l.finish(l.step(protocol.TookThrough{Out: x.h}))
	}
	return nil
}

// render makes the lines of u; nil when none is left for the reader
// (dropped by the dedup window, or unsafe). Called with l.mu held.
func (l *Lines) render(u *Unit) *lined {
	keep := make([]SignedToken, 0, len(u.Tokens))
	for _, t := range u.Tokens {
		if l.Dedup != nil && l.Dedup.Contains(t.Key) {
			continue
		}
		if !l.JSON && (!wire.LineSafe(t.Email) || !wire.LineSafe(t.Login)) {
			// The sender would misparse the line: every other token of
			// it would be lost, or a crafted field would forge rows.
			if l.Log != nil {
				l.Log.Warn("token not written: its email or login holds "+wire.Unsafe, "reason", "unsafe_field", "token_id", t.ID, "stream_seq", u.Seq)
			}
			continue
		}
		keep = append(keep, t)
	}
	if len(keep) == 0 {
		return nil
	}
	x := &lined{u: u}
	var lines []string
	n := l.MaxTokensPerLine
	if n <= 0 {
		n = len(keep)
	}
	for start := 0; start < len(keep); start += n {
		part := keep[start:min(start+n, len(keep))]
		at := len(x.data)
		if l.JSON {
			// Marshalling plain strings and numbers does not fail.
			x.data, _ = AppendJSON(x.data, u.ID, part)
		} else {
			x.data = AppendLine(x.data, part)
		}
		lines = append(lines, string(x.data[at:]))
		x.data = append(x.data, '\n')
		for _, t := range part {
			x.keys = append(x.keys, t.Key)
		}
	}
	x.h = &protocol.Handout{Unit: x, Lines: lines, Size: len(x.data)}
	return x
}

func (l *Lines) write(buf []byte) error {
	_, err := l.writeSome(buf)
	return err
}

// writeSome writes buf, and says how much of it went out when it fails.
func (l *Lines) writeSome(buf []byte) (int, error) {
	n, err := l.outlet().out.Write(buf)
	if err != nil {
		if errors.Is(err, syscall.EPIPE) {
			err = ErrReaderGone
		}
		return n, fmt.Errorf("write lines: %w", err)
	}
	return n, nil
}

// finish tells the Subscriber of the units the book's answer (OutsDone)
// says are done.
func (l *Lines) finish(cmds []protocol.ReaderToDo) {
	var us []*Unit
	for _, c := range cmds {
		if d, ok := c.(protocol.OutsDone); ok {
			for _, h := range d.Outs {
				us = append(us, h.Unit.(*lined).u)
			}
		}
	}
	if done := l.done.Load(); len(us) > 0 && done != nil {
		(*done)(us...)
	}
}

// ReadReports reads the reader's reports until r ends: each a line it
// finished, as it was given (without its newline). A batch is done once
// each of its lines is reported.
func (l *Lines) ReadReports(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	unknown := 0
	for sc.Scan() {
		cmds := l.step(protocol.ReportedLine{Line: strings.TrimSuffix(sc.Text(), "\r")})
		if len(cmds) > 0 {
			if _, ok := cmds[0].(protocol.UnknownLine); ok {
				if unknown++; unknown == 1 && l.Log != nil {
					l.Log.Warn("the sender reported a line it was not given (or twice); ignored")
				}
			}
		}
		l.finish(cmds)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read the sender's reports: %w", err)
	}
	return nil
}

// Stalled reports whether the reader has had lines waiting for longer
// than d without taking a byte of them or finishing a batch: lines in its
// pipe, or lines it took and has not finished (a pipe's reader that has
// not asked for more, or, with Reports, not reported them). A reader idle
// with nothing waiting, having finished what it took, is not stalled; a
// slow one finishes a batch within d. Each call looks again; a health
// check calls it every few seconds.
func (l *Lines) Stalled(d time.Duration) bool {
	unread := 0
	if p := l.CurrentPipe(); p != nil {
		unread = p.Unread()
	}
	return l.step(protocol.StallLook{Now: time.Now(), Unread: unread, Timeout: d})[0].(protocol.StallIs).Stalled
}

// watch: a reader that goes while no message comes is noticed all the
// same: what it had in doubt is handed back at once, not at the next
// message. One that waits for more has finished what it had: on a stream
// that goes quiet the last batch taken would stay in doubt until the next
// one, and a healthy reader killed meanwhile (a redeploy, an OOM kill)
// would have it again (the book settles it once two looks a tick apart
// find the reader waiting, Pipe.ReaderWaits).
func (l *Lines) watch(ctx context.Context, cancel context.CancelCauseFunc, busy func() bool) {
	pipe := l.CurrentPipe()
	if pipe == nil {
		return
	}
	for ctx.Err() == nil {
		if pipe.Gone() {
			cancel(ErrReaderGone)
			return
		}
		for _, c := range l.step(protocol.IdleLook{Busy: busy(), Reports: l.Reports}) {
			l.finish(l.step(protocol.ReaderWaiting{Outs: c.(protocol.AskWaits).Outs, Waits: pipe.ReaderWaits()}))
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

// settle: see reader.
func (l *Lines) settle(o Outcome) (failedOn *Unit, held bool) {
	pipe := l.CurrentPipe()
	unread := int64(0)
	if pipe != nil {
		unread = int64(pipe.Unread())
	}
	end := protocol.ReaderEnd{Done: o == ReaderDone, Failed: o == ReaderFailed, Took: o == ReaderTook, Reports: l.Reports, Pipe: pipe != nil}
	st := l.step(protocol.ReaderEnds{End: end, Unread: unread})[0].(protocol.Settled)
	l.finish([]protocol.ReaderToDo{protocol.OutsDone{Outs: st.Done}})
	if st.Blamed != nil {
		failedOn = st.Blamed.Unit.(*lined).u
	}
	return failedOn, st.Held
}

// inDoubt: see reader.
func (l *Lines) inDoubt() (int, bool) {
	d := l.step(protocol.DoubtLook{Serial: l.serial()})[0].(protocol.Doubt)
	return d.N, d.Unsettled
}

// forget: see reader.
func (l *Lines) forget() { l.step(protocol.ForgetHanded{}) }
