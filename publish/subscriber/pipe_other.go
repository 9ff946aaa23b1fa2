//go:build !linux

package subscriber

import (
	"context"
	"errors"
	"os"
)

// ErrReaderGone is returned when the reader of a pipe has closed it.
var ErrReaderGone = errors.New("the reader of the pipe is gone")

// Pipe is only known on Linux (FIONREAD on a pipe's write end): elsewhere
// OpenPipe says no, and a message is acknowledged once written.
type Pipe struct{}

// OpenPipe returns false: see Pipe.
func OpenPipe(*os.File) (*Pipe, bool) { return nil, false }

// Taken is never called: see Pipe.
func (*Pipe) Taken(context.Context) error { return errors.ErrUnsupported }

// Gone is never called: see Pipe.
func (*Pipe) Gone() bool { return false }

// Unread is never called: see Pipe.
func (*Pipe) Unread() int { return 0 }

// ReaderWaits is never true: see Pipe.
func (*Pipe) ReaderWaits() bool { return false }
