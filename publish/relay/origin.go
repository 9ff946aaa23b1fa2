package relay

import (
	"github.com/mailroom/tailer/decoder/wal"
	"strconv"
	"strings"
)

// Origin identifies the database whose WAL positions a batch carries: the
// cluster's system identifier and timeline (IDENTIFY_SYSTEM) and the
// database. Positions from another system or database mean nothing here:
// compared with this server's, they would skip or repeat tokens. A later
// timeline of the same system continues the same WAL (a promoted standby,
// after a failover): its positions still hold. A restored copy on a new
// timeline is the same system too; the slot's incarnation, which a copy
// does not carry on, tells that one apart (see Scan).
type Origin struct {
	SystemID string
	Timeline int32
	Database string
	// History is where each earlier timeline of this server ended (the
	// server's timeline history); not part of the header.
	History map[int32]wal.LSN
}

// String formats o as system/timeline/database, the header's value.
func (o Origin) String() string {
	return o.SystemID + "/" + strconv.Itoa(int(o.Timeline)) + "/" + o.Database
}

// Continues reports whether a batch published from the origin stored (a
// header's value) at position pos is in o's WAL: the same system and
// database, and the same timeline, or an earlier one of o's history that
// pos does not pass the end of. past says pos was past that end: the
// batch was published from WAL this server does not have.
func (o Origin) Continues(stored string, pos wal.LSN) (ok, past bool) {
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
