package subscriber

import (
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
)

// Stranded moves a reader's connection to another server of its pool once
// its consumer's heartbeats, or the saves of its record, went unanswered
// twice in a row. A node cut off
// from its cluster (partitioned, or with the others frozen) still answers
// pings, so the client stays with it; the consumer's leader is on the
// other side, and nothing of the durable reaches the reader until the
// partition heals (issue 49: 14-30 s without delivery while messages
// waited). A leader being elected also misses heartbeats; moving then
// costs a reconnect, and the pull is asked again either way.
//
// Two misses count as in a row when no message came between them and
// they were at most strandedWithin apart: a subscriber busy with a message
// does not ask, so the iterator's misses come seconds apart (6 s in issue
// 49's runs, against a pull expiry of 1 s).
//
// One goroutine, the consume loop, calls it; the zero value is ready.
type Stranded struct {
	last   time.Time
	missed int
}

const strandedWithin = 30 * time.Second

// Missed notes what went unanswered on nc (a heartbeat of the consumer, a
// save of the durable's record), and moves nc to another server after the
// second in a row.
func (s *Stranded) Missed(nc *nats.Conn, log *slog.Logger, durable, what string) {
	now := time.Now()
	if now.Sub(s.last) > strandedWithin {
		s.missed = 0
	}
	s.last = now
	s.missed++
	if s.missed < 2 || len(nc.Servers()) < 2 {
		return
	}
	s.missed = 0
	if log != nil {
		log.Warn(what+" twice in a row: connecting to another NATS server (this one may be cut off from its cluster)",
			"durable", durable, "server", nc.ConnectedServerName())
	}
	if err := nc.ForceReconnect(); err != nil && log != nil {
		log.Warn("cannot reconnect to another NATS server", "err", err)
	}
}

// Heard notes a message delivered: the consumer reaches the reader.
func (s *Stranded) Heard() { s.missed = 0 }
