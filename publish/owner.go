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

// Owner is the slot incarnation a publisher continues the stream for.
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
}

// ErrForeignStream is a stream whose batches come from another database, or
// another incarnation of the slot, or lie ahead of this server's WAL.
type ErrForeignStream struct {
	Stream string
	Reason string
	Stored string // what the stream says
	Here   string // what the server says
}

func (e *ErrForeignStream) Error() string {
	return fmt.Sprintf("stream %s holds batches %s (stream: %s; this server: %s): publishing would skip or repeat tokens, so the tailer refuses to start. "+
		"To go on from here, run `tailer resync`: it recreates the slot and publishes, once, every still-eligible token of this database that the stream lacks. "+
		"Or use a stream of this database (MAILROOM_NATS_STREAM) once the consumers have drained the old one",
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
		return &ErrForeignStream{Stream: p.name, Reason: "published past the point where this server's timeline branched from theirs (a failover or restore that lost WAL the stream's batches came from)",
			Stored: "origin " + m.origin + ", position " + m.pos.String() + " at seq " + strconv.FormatUint(m.seq, 10), Here: "origin " + here.String() + ", timeline history " + fmt.Sprint(here.History)}
	}
	if !ok {
		return &ErrForeignStream{Stream: p.name, Reason: "published from another database",
			Stored: "origin " + m.origin + " at seq " + strconv.FormatUint(m.seq, 10), Here: "origin " + here.String()}
	}
	return nil
}

// Resume makes the publisher continue the stream for o, once the caller
// holds the slot: the messages it publishes name o's incarnation, and the
// positions of o's messages already on the stream tell which tokens were
// published by an earlier run. Every message after o.Since must be o's:
// one of another database or another incarnation of the slot (a copy or
// restore of the database, a slot made again since), or whose position is
// beyond current, the server's WAL position read after the stream (a
// restore or failover to a server that is behind), means the stream's
// positions do not describe this slot, and trusting them would skip every
// token up to them as already published.
func (p *Publisher) Resume(o Owner, current pglogrepl.LSN) error {
	for _, m := range append([]stored{p.last}, p.laneLast...) {
		if m.seq == 0 || m.seq <= o.Since {
			continue
		}
		if err := p.checkOrigin(m, o.Origin); err != nil {
			return err
		}
		if m.incarnation != o.Incarnation && (m.incarnation != "" || !o.Legacy) {
			stored := "incarnation " + m.incarnation
			if m.incarnation == "" {
				stored = "no incarnation (an older tailer's, or of a slot this database has no record of)"
			}
			return &ErrForeignStream{Stream: p.name, Reason: "published from another incarnation of the slot (a copy or restore of the database, or the slot made again since)",
				Stored: stored + " at seq " + strconv.FormatUint(m.seq, 10), Here: "incarnation " + o.Incarnation + ", stream taken over after seq " + strconv.FormatUint(o.Since, 10)}
		}
		if m.pos.Commit > current {
			return &ErrForeignStream{Stream: p.name, Reason: "whose positions are ahead of this server's WAL",
				Stored: "last position " + m.pos.String() + " at seq " + strconv.FormatUint(m.seq, 10), Here: "current WAL position " + current.String() + ", origin " + o.Origin.String()}
		}
	}
	for lane, m := range p.laneLast {
		if m.seq > o.Since {
			p.lastPos[lane] = m.pos
		}
	}
	p.incarnation = o.Incarnation
	return nil
}

// LastIncarnation is the incarnation named by the stream's last message
// ("" when it names none, or the stream is empty).
func (p *Publisher) LastIncarnation() string { return p.last.incarnation }
