package daemon

import (
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
)

// lagClock answers how far behind the slot's confirmed position is in
// time. It learns from WAL positions paired with a time everything
// committed before lies before them (pg_current_wal_lsn() when the slot
// is sampled, a heartbeat written) and from the positions confirmed (sent
// to the slot after PubAck, or read from the slot): the newest time whose
// position is confirmed is how far the tailer got. A keepalive's time is
// never used: a walsender stuck in a large transaction sends old positions
// at new times.
//
// The lag so measured grows a second a second while nothing is
// confirmed, whatever the reason (the walsender stuck, NATS away, the
// holder frozen: a standby samples the slot too), and falls to about the
// sampling or heartbeat interval once the tailer keeps up.
type lagClock struct {
	mu sync.Mutex
	// pending are the positions not yet confirmed with their times, in
	// WAL order.
	pending []walTime
	// through: everything committed before it is confirmed.
	through time.Time
}

type walTime struct {
	lsn pglogrepl.LSN
	at  time.Time
}

// maxPending bounds the positions kept while nothing is confirmed: past
// it every other one is dropped, so a long stall costs resolution, not
// memory.
const maxPending = 4096

// saw records that everything committed before at lies before lsn.
func (c *lagClock) saw(lsn pglogrepl.LSN, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := len(c.pending); n > 0 && lsn <= c.pending[n-1].lsn {
		// An earlier position seen later: the newer time goes with the
		// position already waiting, which lies past it.
		if at.After(c.pending[n-1].at) {
			c.pending[n-1].at = at
		}
		return
	}
	if len(c.pending) == maxPending {
		kept := c.pending[:0]
		for i := 1; i < len(c.pending); i += 2 {
			kept = append(kept, c.pending[i])
		}
		c.pending = kept
	}
	c.pending = append(c.pending, walTime{lsn, at})
}

// confirmed records a position confirmed to the slot.
func (c *lagClock) confirmed(lsn pglogrepl.LSN) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := 0
	for ; i < len(c.pending) && c.pending[i].lsn <= lsn; i++ {
		if c.pending[i].at.After(c.through) {
			c.through = c.pending[i].at
		}
	}
	c.pending = c.pending[:copy(c.pending, c.pending[i:])]
}

// confirmedAt records that everything committed before at is confirmed
// (the stream's own word: a commit or heartbeat it decoded, confirmed
// after PubAck).
func (c *lagClock) confirmedAt(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if at.After(c.through) {
		c.through = at
	}
}

// lag is how far behind the confirmed position is at now, and whether
// anything is known. Before any position is confirmed it is the time
// since the oldest position seen: at least that far behind.
func (c *lagClock) lag(now time.Time) (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !c.through.IsZero():
		return max(now.Sub(c.through), 0), true
	case len(c.pending) > 0:
		return max(now.Sub(c.pending[0].at), 0), true
	}
	return 0, false
}

// confirmedThrough is the time everything committed before is confirmed
// (zero when unknown).
func (c *lagClock) confirmedThrough() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.through
}
