package subscribe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/subscriber/protocol"
)

// ReportFD is the file descriptor on which a sender started with Reports
// writes each line it finished; MAILROOM_REPORT_FD names it too.
const ReportFD = 3

// Sender runs a command (sh -c) as the reader of a subscriber's lines,
// its standard input a pipe, and starts it again whenever it exits,
// giving it what it had not finished.
type Sender struct {
	Command string
	// Reports gives the command a pipe on ReportFD on which it writes back
	// each line it finished: only those are done, however far ahead it
	// reads.
	Reports bool
	// DoneExit are the exit codes that mean the command finished what it
	// was given, when it exits after the end of its input (the mailroom
	// sender exits 1 there).
	DoneExit []int
	// TransientExit are the exit codes that say the command could not work
	// for a reason that is not the batch's (its mail server is away): they
	// count no attempt against the batch in hand.
	TransientExit []int
	// StopTimeout bounds the wait for the command to finish its input when
	// the subscriber stops; then its process group is killed.
	StopTimeout time.Duration
	// Once: the run must end (tailer dead-letters resend): a command
	// that cannot start, or keeps ending without finishing a batch, ends
	// Run with ErrSenderFailing instead of being started again.
	Once           bool
	Stdout, Stderr io.Writer
	Log            *slog.Logger

	// pid is the running command's (0: none).
	pid atomic.Int64
}

// Name names the sender for the operator: the process it runs now.
func (x *Sender) Name() string {
	if pid := x.pid.Load(); pid != 0 {
		return fmt.Sprintf("the sender (--exec, process group %d)", pid)
	}
	return "the sender (--exec, between two starts)"
}

// killGrace is how long a process group has between SIGTERM and SIGKILL.
const killGrace = 5 * time.Second

// Run runs the command until ctx is done (or the subscriber drained): then
// its input is closed once it
// has taken all of it, and what it was given is done if it saw the end and
// exits with a DoneExit code (with Reports: what it reported). Run returns
// nil when stopped by ctx.
func (x *Sender) Run(ctx context.Context, sub *subscriber.Subscriber, lines *subscriber.Lines, js jetstream.JetStream) error {
	for restart, ends := time.Duration(0), 0; ; {
		batches := sub.Stats().Batches
		p, err := x.start(lines)
		if err != nil {
			return err
		}
		err = sub.Run(ctx, js)
		if err == nil {
			// Stopped, or drained (UntilDrained).
			x.stop(sub, lines, p)
			return nil
		}
		if !errors.Is(err, subscriber.ErrReaderGone) {
			p.in.Close()
			p.kill()
			code := p.wait()
			p.endReports()
			sub.ReaderEnded(context.Background(), subscriber.ReaderStopped)
			x.Log.Info("the sender is stopped", "exit", code)
			return err
		}
		code := x.waitGone(ctx, p)
		p.killGroup()
		p.endReports()
		outcome := subscriber.ReaderFailed
		sig := p.signal()
		switch protocol.EndOfSender(code, slices.Contains(x.TransientExit, code), sig) {
		case protocol.SenderFinished:
			outcome = subscriber.ReaderTook
		case protocol.SenderStopped:
			outcome = subscriber.ReaderStopped
		case protocol.SenderKilled:
			outcome = subscriber.ReaderStopped
			x.Log.Warn("the sender was killed by a signal: what it held comes again, counted against no batch", "signal", sig.String())
		}
		// Settled with its pipe still open: what it left unread there
		// tells which batches it took.
		n := sub.ReaderEnded(context.Background(), outcome)
		p.in.Close()
		progressed := sub.Stats().Batches > batches
		if ends++; progressed {
			ends = 0
		}
		if err := x.giveUp(code, ends); err != nil {
			return err
		}
		restart = protocol.RestartIn(restart, progressed)
		x.Log.Warn("the sender exited: starting it again, with the lines it may not have finished", "exit", code, "messages_again", n, "in", restart)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(restart):
		}
	}
}

// waitGone waits for a sender that stopped reading its input to exit,
// and returns its exit code. One that lives on past StopTimeout (its
// input closed, or the subscriber stopping meanwhile) has its process
// group stopped: the subscriber never waits on it for longer than its
// stop timeout, whatever it does.
func (x *Sender) waitGone(ctx context.Context, p *proc) int {
	timeout := time.NewTimer(x.StopTimeout)
	defer timeout.Stop()
	select {
	case <-p.exited:
		return p.wait()
	case <-timeout.C:
		x.Log.Warn("the sender stopped reading its input and did not exit within the stop timeout: stopping its process group", "timeout", x.StopTimeout)
	case <-ctx.Done():
		stop := time.NewTimer(x.StopTimeout)
		defer stop.Stop()
		select {
		case <-p.exited:
			return p.wait()
		case <-stop.C:
			x.Log.Warn("stopping: the sender stopped reading its input and did not exit within the stop timeout; stopping its process group", "timeout", x.StopTimeout)
		}
	}
	p.killGroup()
	return p.wait()
}

// ErrSenderFailing: a run that must end (Once) stopped on a sender that
// cannot start or keeps failing; what it had not finished stays.
var ErrSenderFailing = errors.New("the sender cannot do its work")

// giveUp is ErrSenderFailing, wrapped with what the sender did, when a
// run that must end stops on it: its exit code, ends in a row without a
// batch finished.
func (x *Sender) giveUp(code, ends int) error {
	if !x.Once {
		return nil
	}
	switch protocol.AfterSenderEnd(code, ends) {
	case protocol.CannotStart:
		return fmt.Errorf("%w: the shell cannot run %q (exit %d: not found or not executable); fix --exec and run it again", ErrSenderFailing, x.Command, code)
	case protocol.KeepsFailing:
		return fmt.Errorf("%w: it ended %d times in a row without finishing a line (last exit %d); fix your sender (its output above says why) and run it again", ErrSenderFailing, ends, code)
	}
	return nil
}

// proc is one run of the command.
type proc struct {
	cmd     *exec.Cmd
	in      *os.File
	exited  chan struct{}
	code    int
	sig     syscall.Signal
	reports *os.File
	read    chan struct{}
}

func (x *Sender) start(lines *subscriber.Lines) (*proc, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("pipe to the sender: %w", err)
	}
	cmd := exec.Command("sh", "-c", x.Command)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r, x.Stdout, x.Stderr
	// A group of its own: stopping it stops whatever it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var rr, rw *os.File
	if x.Reports {
		if rr, rw, err = os.Pipe(); err != nil {
			r.Close()
			w.Close()
			return nil, fmt.Errorf("pipe for the sender's reports: %w", err)
		}
		cmd.ExtraFiles = []*os.File{rw}
		cmd.Env = append(os.Environ(), fmt.Sprintf("MAILROOM_REPORT_FD=%d", ReportFD))
	}
	err = cmd.Start()
	r.Close()
	if rw != nil {
		rw.Close()
	}
	if err != nil {
		w.Close()
		if rr != nil {
			rr.Close()
		}
		return nil, fmt.Errorf("start the sender: %w", err)
	}
	p := &proc{cmd: cmd, in: w, exited: make(chan struct{}), reports: rr, read: make(chan struct{})}
	x.pid.Store(int64(cmd.Process.Pid))
	go func() {
		err := cmd.Wait()
		x.pid.CompareAndSwap(int64(cmd.Process.Pid), 0)
		p.code = 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			p.code = ee.ExitCode()
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				p.sig = ws.Signal()
			}
		} else if err != nil {
			p.code = -1
		}
		close(p.exited)
	}()
	if rr != nil {
		go func() {
			defer close(p.read)
			// Its own context: reports that come as the subscriber stops
			// are acknowledged all the same.
			if err := lines.ReadReports(rr); err != nil {
				x.Log.Warn("reading the sender's reports", "err", err)
			}
		}()
	} else {
		close(p.read)
	}
	pipe, _ := subscriber.OpenPipe(w)
	lines.SetOut(w, pipe)
	return p, nil
}

// stop ends the command as the subscriber stops: the end of its input
// once it took all of it, a wait for its exit, then its process group
// stopped.
func (x *Sender) stop(sub *subscriber.Subscriber, lines *subscriber.Lines, p *proc) {
	stopCtx, cancel := context.WithTimeout(context.Background(), x.StopTimeout)
	defer cancel()
	// Its exit code says it did what it was given only if it read all of
	// it and was still there to see the end: a sender that exited on its
	// own (head -n K) left the lines still in the pipe, or the ones it
	// read ahead, undone.
	pipe := lines.CurrentPipe()
	sawEnd := pipe != nil && pipe.Taken(stopCtx) == nil && !pipe.Gone()
	p.in.Close()
	select {
	case <-p.exited:
	case <-stopCtx.Done():
		x.Log.Warn("stopping: the sender did not finish within the stop timeout; stopping its process group", "timeout", x.StopTimeout)
	}
	p.killGroup()
	code := p.wait()
	p.endReports()
	outcome := subscriber.ReaderStopped
	if sawEnd && slices.Contains(x.DoneExit, code) {
		outcome = subscriber.ReaderDone
	} else {
		x.Log.Info("stopping: the sender did not read to the end of its input and exit with a code that means done", "exit", code)
	}
	if n := sub.ReaderEnded(context.Background(), outcome); n > 0 {
		x.Log.Info("stopping: lines a sender may not have finished are delivered again", "messages", n)
	}
}

// signal is the signal that ended the command: its own death by one, or,
// when sh ran it as a child and exited after it, sh's 128+N; 0 for none.
func (p *proc) signal() syscall.Signal {
	<-p.exited
	switch {
	case p.sig != 0:
		return p.sig
	case p.code > 128 && p.code <= 128+64:
		return syscall.Signal(p.code - 128)
	}
	return 0
}

// wait waits for the command's exit and returns its code (-1: killed by a
// signal).
func (p *proc) wait() int {
	<-p.exited
	return p.code
}

// kill stops the command's process group at once.
func (p *proc) kill() { syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) }

// killGroup stops whatever is left of the command's process group:
// SIGTERM, then SIGKILL after killGrace.
func (p *proc) killGroup() {
	pgid := p.cmd.Process.Pid
	if syscall.Kill(-pgid, syscall.SIGTERM) != nil {
		return
	}
	deadline := time.Now().Add(killGrace)
	for time.Now().Before(deadline) {
		// Signal 0: is any process of the group left?
		if syscall.Kill(-pgid, 0) != nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	syscall.Kill(-pgid, syscall.SIGKILL)
}

// endReports waits for the reports the command wrote to be read; a
// process that kept the descriptor open past the command's exit is cut
// off after a while.
func (p *proc) endReports() {
	if p.reports == nil {
		return
	}
	select {
	case <-p.read:
	case <-time.After(killGrace):
		p.reports.Close()
		<-p.read
	}
	p.reports.Close()
}
