package publish

import (
	"fmt"
	"strconv"

	"github.com/jackc/pglogrepl"
)

// Origin identifies the database whose WAL positions a batch carries: the
// cluster's system identifier and timeline (IDENTIFY_SYSTEM) and the
// database. Positions from another origin mean nothing here: compared with
// this server's, they would skip or repeat tokens.
type Origin struct {
	SystemID string
	Timeline int32
	Database string
}

// String formats o as system/timeline/database, the header's value.
func (o Origin) String() string {
	return o.SystemID + "/" + strconv.Itoa(int(o.Timeline)) + "/" + o.Database
}

// ErrForeignStream is a stream whose batches come from another database, or
// lie ahead of this server's WAL.
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

// CheckOrigin refuses a stream whose last batch was published from another
// origin than here, or whose last position is beyond current, the server's
// WAL position: a restore, a point-in-time recovery, a new cluster or a
// failover to a standby that was behind. Either way the stream's positions
// do not describe this server's WAL, and trusting them would skip every
// token up to the stream's position as already published.
func (p *Publisher) CheckOrigin(here Origin, current pglogrepl.LSN) error {
	if p.lastOrigin != "" && p.lastOrigin != here.String() {
		return &ErrForeignStream{Stream: p.name, Reason: "published from another database", Stored: "origin " + p.lastOrigin, Here: "origin " + here.String()}
	}
	for _, pos := range p.lastPos {
		if pos.Commit > current {
			return &ErrForeignStream{Stream: p.name, Reason: "whose positions are ahead of this server's WAL",
				Stored: "last position " + pos.String(), Here: "current WAL position " + current.String() + ", origin " + here.String()}
		}
	}
	return nil
}
