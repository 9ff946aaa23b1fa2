package consume

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// ErrReaderGone is returned when the reader of a pipe has closed it.
var ErrReaderGone = errors.New("the reader of the pipe is gone")

// Pipe is the write end of a pipe, as seen by its writer: whether its
// reader has taken what was written, and whether the reader is still there.
type Pipe struct{ fd int }

// OpenPipe returns f as a Pipe; ok is false when f is not a pipe.
func OpenPipe(f *os.File) (p *Pipe, ok bool) {
	fd := int(f.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return nil, false
	}
	return &Pipe{fd: fd}, true
}

// Taken waits until the reader has taken every byte written (the pipe
// holds none: FIONREAD on either end counts them), or fails with
// ErrReaderGone once the reader has closed the pipe with bytes in it. A
// reader that took the bytes and then left did take them.
func (p *Pipe) Taken(ctx context.Context) error {
	wait := 100 * time.Microsecond
	for {
		n, err := unix.IoctlGetInt(p.fd, unix.TIOCINQ) // FIONREAD
		if err != nil {
			return fmt.Errorf("read the pipe's fill (FIONREAD): %w", err)
		}
		if n == 0 {
			return nil
		}
		if p.Gone() {
			return ErrReaderGone
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 20*time.Millisecond)
	}
}

// Gone reports whether the reader has closed the pipe (poll shows POLLERR
// on the write end of a pipe without readers).
func (p *Pipe) Gone() bool {
	fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLOUT}}
	if _, err := unix.Poll(fds, 0); err != nil {
		return false
	}
	return fds[0].Revents&(unix.POLLERR|unix.POLLHUP) != 0
}
