package publish

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
)

// Origin identifies the database whose WAL positions a batch carries: the
// cluster's system identifier and timeline (IDENTIFY_SYSTEM) and the
// database. Positions from another system or database mean nothing here:
// compared with this server's, they would skip or repeat tokens. A later
// timeline of the same system continues the same WAL (a promoted standby,
// after a failover): its positions still hold. A restored copy on a new
// timeline is the same system too; the slot's incarnation, which a copy
// does not carry on, tells that one apart (see Resume).
type Origin struct {
	SystemID string
	Timeline int32
	Database string
	// History is where each earlier timeline of this server ended
	// (replication.TimelineBranches); not part of the header.
	History map[int32]pglogrepl.LSN
}

// String formats o as system/timeline/database, the header's value.
func (o Origin) String() string {
	return o.SystemID + "/" + strconv.Itoa(int(o.Timeline)) + "/" + o.Database
}

// continues reports whether a batch published from the origin stored (a
// header's value) at position pos is in o's WAL: the same system and
// database, and the same timeline, or an earlier one of o's history that
// pos does not pass the end of. past says pos was past that end: the batch
// was published from WAL this server does not have.
func (o Origin) continues(stored string, pos pglogrepl.LSN) (ok, past bool) {
	if stored == o.String() {
		return true, false
	}
	parts := strings.SplitN(stored, "/", 3)
	if len(parts) != 3 || parts[0] != o.SystemID || parts[2] != o.Database {
		return false, false
	}
	tl, err := strconv.ParseInt(parts[1], 10, 32)
	if err != nil || int32(tl) >= o.Timeline {
		return false, false
	}
	end, known := o.History[int32(tl)]
	if !known {
		return false, false
	}
	return pos <= end, pos > end
}

// Owner is the slot incarnation a publisher continues the stream for, and
// what its session needs to know to resume (see Resume).
type Owner struct {
	Origin      Origin
	Incarnation string
	// Since is the stream's last sequence when the incarnation took the
	// stream over: messages up to it belong to earlier incarnations (or
	// another database, before a resync) and say nothing about this one.
	Since uint64
	// Legacy: the incarnation predates incarnation headers, so its
	// messages without one are its own.
	Legacy bool
	// After is the slot's confirmed position: the session replays every
	// token past it, and Resume finds which of those the stream holds.
	// Zero for a resync, which publishes no positions.
	After pglogrepl.LSN
	// InFlight is the most messages the session keeps awaiting their
	// PubAck (at least 1).
	InFlight int
}

// ForeignStreamError is a stream whose batches come from another database, or
// another incarnation of the slot. It says what was found; what to do
// about it is the command layer's to say.
type ForeignStreamError struct {
	Stream string
	Reason string
	Stored string // what the stream says
	Here   string // what the server says
}

func (e *ForeignStreamError) Error() string {
	return fmt.Sprintf("stream %s holds batches %s (stream: %s; this server: %s): publishing would skip or repeat tokens",
		e.Stream, e.Reason, e.Stored, e.Here)
}

// CheckOrigin refuses a stream whose last message was published from
// another database than here: another database of the server, a new
// cluster, a restore to a new cluster.
func (p *Publisher) CheckOrigin(here Origin) error {
	return p.checkOrigin(p.last, here)
}

func (p *Publisher) checkOrigin(m stored, here Origin) error {
	if m.origin == "" {
		return nil
	}
	ok, past := here.continues(m.origin, m.pos.Commit)
	if past {
		return &ForeignStreamError{Stream: p.name, Reason: "published past the point where this server's timeline branched from theirs (a failover or restore that lost WAL the stream's batches came from)",
			Stored: "origin " + m.origin + ", position " + m.pos.String() + " at seq " + strconv.FormatUint(m.seq, 10), Here: "origin " + here.String() + ", timeline history " + fmt.Sprint(here.History)}
	}
	if !ok {
		return &ForeignStreamError{Stream: p.name, Reason: "published from another database",
			Stored: "origin " + m.origin + " at seq " + strconv.FormatUint(m.seq, 10), Here: "origin " + here.String()}
	}
	return nil
}

// checkOwner refuses a message after o.Since that is not o's: of another
// database, or of another incarnation of the slot (a copy or restore of
// the database, a slot made again since).
func (p *Publisher) checkOwner(m stored, o Owner) error {
	if m.seq <= o.Since {
		return nil
	}
	if err := p.checkOrigin(m, o.Origin); err != nil {
		return err
	}
	if m.incarnation != o.Incarnation && (m.incarnation != "" || !o.Legacy) {
		stored := "incarnation " + m.incarnation
		if m.incarnation == "" {
			stored = "no incarnation (an older tailer's, or of a slot this database has no record of)"
		}
		return &ForeignStreamError{Stream: p.name, Reason: "published from another incarnation of the slot (a copy or restore of the database, or the slot made again since)",
			Stored: stored + " at seq " + strconv.FormatUint(m.seq, 10), Here: "incarnation " + o.Incarnation + ", stream taken over after seq " + strconv.FormatUint(o.Since, 10)}
	}
	return nil
}
