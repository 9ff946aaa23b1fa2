package relay

import (
	"fmt"
	"github.com/mailroom/tailer/decoder/wal"
	"strconv"
)

// PublishedKind is what a message on the stream's subjects is.
type PublishedKind uint8

// Message kinds.
const (
	// Other is neither a batch nor a marker: another publisher's.
	Other PublishedKind = iota
	// Batch is a batch of tokens (wire.IsBatch).
	Batch
	// Marker is a session marker (wire.IsMarker).
	Marker
)

// Published is what the tailer reads of a message already on the stream.
type Published struct {
	Seq         uint64
	Subject     string
	Is          PublishedKind
	Origin      string
	Incarnation string
	// Batches: the first and last positions they cover (zero for a
	// resync's; First zero for a tailer's before the first-position
	// header), their token keys (comma-joined), and whether a resync
	// published them.
	First, Last wal.Position
	Keys        string
	Resync      bool
	// Markers: their place among their session's (FenceN of FenceK),
	// that session's in-flight bound and what it found on the stream
	// (the slot position its window starts after, and its first
	// sequence).
	FenceN, FenceK, InFlight int
	After                    wal.LSN
	Floor                    uint64
}

// Owner is the slot incarnation a session continues the stream for, and
// what it needs to know to resume (see Scan).
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
	// token past it, and Scan finds which of those the stream holds.
	// Zero for a resync, which publishes no positions.
	After wal.LSN
	// InFlight is the most messages the session keeps awaiting their
	// PubAck (at least 1).
	InFlight int
}

// ForeignStreamError is a stream whose batches come from another
// database, or another incarnation of the slot. It says what was found;
// what to do about it is the command layer's to say.
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

// CheckOrigin refuses m, a message of stream, published from another
// database than here: another database of the server, a new cluster, a
// restore to a new cluster, or a server whose timeline branched before
// the position m was published from.
func CheckOrigin(stream string, m Published, here Origin) error {
	if m.Origin == "" {
		return nil
	}
	ok, past := here.Continues(m.Origin, m.Last.Commit)
	if past {
		return &ForeignStreamError{Stream: stream, Reason: "published past the point where this server's timeline branched from theirs (a failover or restore that lost WAL the stream's batches came from)",
			Stored: "origin " + m.Origin + ", position " + m.Last.String() + " at seq " + strconv.FormatUint(m.Seq, 10), Here: "origin " + here.String() + ", timeline history " + fmt.Sprint(here.History)}
	}
	if !ok {
		return &ForeignStreamError{Stream: stream, Reason: "published from another database",
			Stored: "origin " + m.Origin + " at seq " + strconv.FormatUint(m.Seq, 10), Here: "origin " + here.String()}
	}
	return nil
}

// CheckOwner refuses a message of stream after o.Since that is not o's:
// of another database, or of another incarnation of the slot (a copy or
// restore of the database, a slot made again since).
func CheckOwner(stream string, m Published, o Owner) error {
	if m.Seq <= o.Since {
		return nil
	}
	if err := CheckOrigin(stream, m, o.Origin); err != nil {
		return err
	}
	if m.Incarnation != o.Incarnation && (m.Incarnation != "" || !o.Legacy) {
		stored := "incarnation " + m.Incarnation
		if m.Incarnation == "" {
			stored = "no incarnation (an older tailer's, or of a slot this database has no record of)"
		}
		return &ForeignStreamError{Stream: stream, Reason: "published from another incarnation of the slot (a copy or restore of the database, or the slot made again since)",
			Stored: stored + " at seq " + strconv.FormatUint(m.Seq, 10), Here: "incarnation " + o.Incarnation + ", stream taken over after seq " + strconv.FormatUint(o.Since, 10)}
	}
	return nil
}
