package subscriber

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
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

	mu sync.Mutex
	// done is the Subscriber's, given with the units.
	done func(...*Unit)
	// handed are the units given to the reader and not done, in the
	// order they were written.
	handed []*lined
	// lines are the lines handed and not yet reported, by content.
	lines map[string][]*lined
	// written counts the bytes written to Out since the last settle.
	written int64
	// finished counts the units done; stall follows the reader from one
	// look of Stalled to the next.
	finished int
	stall    protocol.Stall
}

// lined is a unit as lines.
type lined struct {
	u     *Unit
	data  []byte
	keys  []string
	lines []string
	// end is Lines.written once the unit was written.
	end      int64
	reported int
	done     bool
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
func (l *Lines) serial() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.Pipe != nil && !l.Reports
}

// SetOut sets Out and Pipe (nil when out is not a pipe): a sender started
// again gets a pipe of its own.
func (l *Lines) SetOut(out io.Writer, pipe *Pipe) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.Out, l.Pipe = out, pipe
	l.stall.Moved(time.Now())
}

// Hand writes us to the reader as Out's kind asks.
func (l *Lines) Hand(ctx context.Context, us []*Unit, done func(...*Unit)) error {
	l.mu.Lock()
	l.done = done
	var ls []*lined
	var none []*Unit
	for _, u := range us {
		if x := l.render(u); x != nil {
			ls = append(ls, x)
		} else {
			none = append(none, u)
		}
	}
	l.mu.Unlock()
	if len(none) > 0 {
		// Nothing of them for this reader: done as they are.
		done(none...)
	}
	switch {
	case l.Reports:
		// The reader says what it finished: write all, it may read ahead.
		var buf []byte
		l.mu.Lock()
		if l.lines == nil {
			l.lines = make(map[string][]*lined)
		}
		for _, x := range ls {
			buf = append(buf, x.data...)
			l.written += int64(len(x.data))
			x.end = l.written
			l.handed = append(l.handed, x)
			for _, line := range x.lines {
				l.lines[line] = append(l.lines[line], x)
			}
		}
		l.mu.Unlock()
		return l.write(buf)
	case l.Pipe != nil:
		return l.handPipe(ctx, ls)
	default:
		var buf []byte
		for _, x := range ls {
			buf = append(buf, x.data...)
		}
		l.mu.Lock()
		l.handed = append(l.handed, ls...)
		l.mu.Unlock()
		if err := l.write(buf); err != nil {
			return err
		}
		// The lines are out: only now may the server forget them.
		l.finish(ls)
		return nil
	}
}

// handPipe writes ls to the pipe one at a time: once the reader took one,
// it is done with those before.
func (l *Lines) handPipe(ctx context.Context, ls []*lined) error {
	for _, x := range ls {
		if err := ctx.Err(); err != nil {
			// Stopping, or the reader went: hand it nothing more.
			return fmt.Errorf("hand lines over: %w", err)
		}
		l.mu.Lock()
		l.written += int64(len(x.data))
		x.end = l.written
		l.handed = append(l.handed, x)
		l.mu.Unlock()
		if n, err := l.writeSome(x.data); err != nil {
			// What did not reach the pipe (a reader gone: EPIPE) was not
			// written, and its reader cannot have taken it whole.
			l.mu.Lock()
			l.written -= int64(len(x.data) - n)
			l.mu.Unlock()
			return err
		}
		if err := l.Pipe.Taken(ctx); err != nil {
			return fmt.Errorf("hand lines over: %w", err)
		}
		l.mu.Lock()
		before := slices.Clone(l.handed[:slices.Index(l.handed, x)])
		l.mu.Unlock()
		l.finish(before)
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
		x.lines = append(x.lines, string(x.data[at:]))
		x.data = append(x.data, '\n')
		for _, t := range part {
			x.keys = append(x.keys, t.Key)
		}
	}
	return x
}

func (l *Lines) write(buf []byte) error {
	_, err := l.writeSome(buf)
	return err
}

// writeSome writes buf, and says how much of it went out when it fails.
func (l *Lines) writeSome(buf []byte) (int, error) {
	n, err := l.Out.Write(buf)
	if err != nil {
		if errors.Is(err, syscall.EPIPE) {
			err = ErrReaderGone
		}
		return n, fmt.Errorf("write lines: %w", err)
	}
	return n, nil
}

// finish marks ls done and tells the Subscriber.
func (l *Lines) finish(ls []*lined) {
	l.mu.Lock()
	var us []*Unit
	for _, x := range ls {
		if x.done {
			continue
		}
		x.done = true
		if i := slices.Index(l.handed, x); i >= 0 {
			l.handed = slices.Delete(l.handed, i, i+1)
		}
		if l.Dedup != nil {
			for _, k := range x.keys {
				l.Dedup.Seen(k)
			}
		}
		l.finished++
		us = append(us, x.u)
	}
	done := l.done
	l.mu.Unlock()
	if len(us) > 0 && done != nil {
		done(us...)
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
		line := strings.TrimSuffix(sc.Text(), "\r")
		l.mu.Lock()
		q := l.lines[line]
		var finished []*lined
		if len(q) == 0 {
			unknown++
		} else {
			x := q[0]
			if len(q) == 1 {
				delete(l.lines, line)
			} else {
				l.lines[line] = q[1:]
			}
			if x.reported++; x.reported == len(x.lines) {
				finished = append(finished, x)
			}
		}
		l.mu.Unlock()
		if unknown == 1 && len(q) == 0 && l.Log != nil {
			l.Log.Warn("the sender reported a line it was not given (or twice); ignored")
		}
		l.finish(finished)
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
	l.mu.Lock()
	defer l.mu.Unlock()
	unread := 0
	if l.Pipe != nil {
		unread = l.Pipe.Unread()
	}
	return l.stall.Look(time.Now(), unread, len(l.handed), l.finished, d)
}

// watch: a reader that goes while no message comes is noticed all the
// same: what it had in doubt is handed back at once, not at the next
// message. One that waits for more has finished what it had (settleIdle).
func (l *Lines) watch(ctx context.Context, cancel context.CancelCauseFunc, busy func() bool) {
	l.mu.Lock()
	pipe := l.Pipe
	l.mu.Unlock()
	if pipe == nil {
		return
	}
	waited := false
	for ctx.Err() == nil {
		if pipe.Gone() {
			cancel(ErrReaderGone)
			return
		}
		waited = l.settleIdle(pipe, waited, busy)
		sleep(ctx, 200*time.Millisecond)
	}
}

// settleIdle settles the batches in doubt on a pipe while no message is
// being handed over, once the reader says, by waiting for more
// (Pipe.ReaderWaits), that it finished them: on a stream that goes quiet
// the last batch taken would stay in doubt until the next one, and a
// healthy reader killed meanwhile (a redeploy, an OOM kill) would have it
// again. It takes two looks a tick apart (waited: the first was seen), so
// that a reader between two reads is not taken for one that waits; it
// returns what the next call gets as waited.
func (l *Lines) settleIdle(pipe *Pipe, waited bool, busy func() bool) bool {
	l.mu.Lock()
	idle := !l.Reports && !busy() && len(l.handed) > 0
	handed := slices.Clone(l.handed)
	l.mu.Unlock()
	switch {
	case !idle || !pipe.ReaderWaits():
		return false
	case !waited:
		return true
	}
	l.finish(handed)
	return false
}

// settle: see reader.
func (l *Lines) settle(o Outcome) (failedOn *Unit, held bool) {
	l.mu.Lock()
	handed := slices.Clone(l.handed)
	unread := int64(0)
	if l.Pipe != nil {
		unread = int64(l.Pipe.Unread())
	}
	end := protocol.ReaderEnd{Done: o == ReaderDone, Failed: o == ReaderFailed, Took: o == ReaderTook, Reports: l.Reports, Pipe: l.Pipe != nil, Taken: l.written - unread}
	for _, x := range handed {
		end.Ends = append(end.Ends, x.end)
	}
	l.mu.Unlock()
	done, blamed := protocol.AfterReaderEnd(end)
	l.finish(handed[:done])
	if blamed >= 0 {
		failedOn = handed[blamed].u
	}
	handed = handed[done:]
	l.forget()
	return failedOn, len(handed) > 0
}

// inDoubt: see reader.
func (l *Lines) inDoubt() (int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.handed), l.Pipe != nil && !l.Reports && len(l.handed) > 0
}

// forget: see reader.
func (l *Lines) forget() {
	l.mu.Lock()
	l.handed, l.lines, l.written = nil, nil, 0
	l.mu.Unlock()
}
