package decoder

import (
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
)

// HeartbeatPrefix is the prefix of the logical messages the tailer writes
// into the WAL (pg_logical_emit_message, not transactional) to learn how
// far behind it is when no token is written. The content is the time of
// writing in Unix microseconds, in decimal.
const HeartbeatPrefix = "mailroom_tailer_heartbeat"

// HeartbeatContent is the content of a heartbeat written at at.
func HeartbeatContent(at time.Time) string { return strconv.FormatInt(at.UnixMicro(), 10) }

// parseHeartbeat reads a heartbeat's content.
func parseHeartbeat(content []byte) (time.Time, bool) {
	us, err := strconv.ParseInt(string(content), 10, 64)
	if err != nil || us <= 0 {
		return time.Time{}, false
	}
	return time.UnixMicro(us), true
}

// message reads a logical message. Only heartbeats mean anything to the
// tailer: other prefixes, transactional messages and a heartbeat whose
// content is not a time (someone else's message under the prefix) are
// passed over, as a row of an unpublished table would be.
func (d *Decoder) message(r *reader, sink Sink) error {
	if d.inStream {
		r.u32() // xid
	}
	flags := r.u8()
	lsn := pglogrepl.LSN(r.u64())
	prefix := r.cstring()
	content := r.bytes(int(r.u32()))
	if r.err != nil {
		return r.fail("message")
	}
	if flags&1 != 0 || string(prefix) != HeartbeatPrefix {
		return nil
	}
	if at, ok := parseHeartbeat(content); ok {
		sink.Heartbeat(lsn, at)
	}
	return nil
}
