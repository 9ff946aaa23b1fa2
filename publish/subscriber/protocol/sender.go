package protocol

import (
	"syscall"
	"time"
)

// SenderEnd is what a sender's exit says of the batches it held.
type SenderEnd uint8

const (
	// SenderFailed: it failed with batches in hand (an exit code that is
	// not 0 or transient, a crash by its own signal); the oldest batch it
	// took and did not finish counts an attempt.
	SenderFailed SenderEnd = iota
	// SenderStopped: it could not work for a reason of its own (a
	// transient code): not the batch's fault, and nothing done.
	SenderStopped
	// SenderKilled: a signal from outside ended it (the OOM killer, a
	// redeploy, an operator): it said nothing of the batch, which comes
	// again counted against none.
	SenderKilled
	// SenderFinished: it exited 0 on its own, before the end of its
	// input: it is done with every line it took (head -n 1 takes one
	// line, writes it, and exits).
	SenderFinished
)

// EndOfSender judges a sender's exit: its code, whether the code is one
// of the transient ones, and the signal that ended it (0: none).
func EndOfSender(code int, transient bool, sig syscall.Signal) SenderEnd {
	switch {
	case code == 0:
		return SenderFinished
	case transient:
		return SenderStopped
	}
	if killedFromOutside(sig) {
		return SenderKilled
	}
	return SenderFailed
}

// killedFromOutside reports whether sig ends a process from outside
// (SIGKILL, SIGTERM, SIGINT, SIGHUP) rather than by its own fault
// (SIGSEGV, SIGABRT, ...: a crash counts against the batch it held).
func killedFromOutside(sig syscall.Signal) bool {
	return sig == syscall.SIGKILL || sig == syscall.SIGTERM || sig == syscall.SIGINT || sig == syscall.SIGHUP
}

// RestartIn is how long to wait before starting a sender again, after
// the wait before (prev): at once after one that got through a batch
// since (progressed); else, for one that did not (a wrong command, say),
// twice the wait before, from 250 ms up to 10 s.
func RestartIn(prev time.Duration, progressed bool) time.Duration {
	if progressed {
		return 0
	}
	return min(max(2*prev, 250*time.Millisecond), 10*time.Second)
}

// GiveUpAfter is how many ends in a row without a batch finished a
// sender of a run that must end (tailer dead-letters resend) is started
// again before the run stops: with the backoff of RestartIn, a few
// seconds.
const GiveUpAfter = 3

// SenderVerdict is what becomes of a run that must end (a resend, not a
// subscriber kept by a supervisor) after its sender ended with code.
type SenderVerdict uint8

const (
	// StartAgain: start the sender again after RestartIn.
	StartAgain SenderVerdict = iota
	// CannotStart: the shell could not run the command (126: not
	// executable, 127: not found); starting it again changes nothing.
	CannotStart
	// KeepsFailing: it ended GiveUpAfter times in a row without
	// finishing a batch.
	KeepsFailing
)

// AfterSenderEnd decides, for a run that must end, on a sender that ended
// with code, having ended endsInARow times in a row without finishing
// a batch, this one included (tailer dead-letters resend with a sender
// that cannot start ran until stopped, restarting it every 10 s).
func AfterSenderEnd(code, endsInARow int) SenderVerdict {
	switch {
	case code == 126 || code == 127:
		return CannotStart
	case endsInARow >= GiveUpAfter:
		return KeepsFailing
	}
	return StartAgain
}
