package replication

import (
	"errors"
	"net"
	"sync"
	"syscall"
	"time"
)

const (
	// bulkLowWater is how many bytes must be waiting before a reader of a
	// fast stream is woken: some fifty rows (the size that drained fastest
	// and cheapest; docs/performance.md).
	bulkLowWater = 8 << 10
	// bulkWait bounds how long bytes below bulkLowWater wait: the latency
	// the end of a burst pays once.
	bulkWait = 2 * time.Millisecond
	// rateWindow is the span over which a stream counts as fast when it
	// delivers bulkLowWater bytes in it (2 MB/s, some 13,000 rows/s, and
	// more).
	rateWindow = 4 * time.Millisecond
)

// lowWaterConn stops the walsender's row-by-row sends from waking the
// tailer once per row: every wakeup costs CPU on both sides, CPU that on a
// small machine the walsender itself needs. While the stream is fast, the
// socket's SO_RCVLOWAT is raised so that the kernel wakes the reader only
// once bulkLowWater bytes are waiting, or after bulkWait; a slow stream
// (live traffic) reads every byte as soon as it arrives. Bulk mode ends at
// the first pause on purpose: a reader that leaves data queued for long makes
// the walsender's sends dearer (docs/performance.md has the measurements).
type lowWaterConn struct {
	net.Conn
	raw syscall.RawConn // nil when the socket cannot be tuned

	bulk      bool
	winStart  time.Time
	winBytes  int
	deadlines sync.Mutex
	deadline  time.Time // the caller's read deadline
}

func newLowWaterConn(c net.Conn) net.Conn {
	lc := &lowWaterConn{Conn: c}
	if sc, ok := c.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil && setRcvLowat(raw, 1) == nil {
			lc.raw = raw
		}
	}
	return lc
}

func (c *lowWaterConn) SetDeadline(t time.Time) error {
	c.deadlines.Lock()
	defer c.deadlines.Unlock()
	c.deadline = t
	return c.Conn.SetDeadline(t)
}

func (c *lowWaterConn) SetReadDeadline(t time.Time) error {
	c.deadlines.Lock()
	defer c.deadlines.Unlock()
	c.deadline = t
	return c.Conn.SetReadDeadline(t)
}

// readWithin reads with a deadline no later than limit. It reports whether
// the caller's own deadline was the one in force.
func (c *lowWaterConn) readWithin(p []byte, limit time.Time) (int, bool, error) {
	c.deadlines.Lock()
	callers := !c.deadline.IsZero() && !limit.Before(c.deadline)
	if callers {
		limit = c.deadline
	}
	c.Conn.SetReadDeadline(limit)
	c.deadlines.Unlock()
	n, err := c.Conn.Read(p)
	c.deadlines.Lock()
	c.Conn.SetReadDeadline(c.deadline)
	c.deadlines.Unlock()
	return n, callers, err
}

func (c *lowWaterConn) Read(p []byte) (int, error) {
	if c.raw == nil {
		return c.Conn.Read(p)
	}
	if c.bulk {
		n, callers, err := c.readWithin(p, time.Now().Add(bulkWait))
		if n > 0 || callers || !isTimeout(err) {
			return n, err
		}
		// The stream slowed down or stopped: from now on every byte wakes
		// the reader again.
		if err := c.setBulk(false); err != nil {
			return 0, err
		}
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		now := time.Now()
		if now.Sub(c.winStart) > rateWindow {
			c.winStart, c.winBytes = now, 0
		}
		c.winBytes += n
		if c.winBytes >= bulkLowWater {
			c.winStart, c.winBytes = now, 0
			if err := c.setBulk(true); err != nil {
				return n, err
			}
		}
	}
	return n, err
}

func (c *lowWaterConn) setBulk(on bool) error {
	c.bulk = on
	v := 1
	if on {
		v = bulkLowWater
	}
	if err := setRcvLowat(c.raw, v); err != nil {
		return &net.OpError{Op: "setsockopt SO_RCVLOWAT", Net: "tcp", Err: err}
	}
	return nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
