package decoder

import (
	"github.com/mailroom/tailer/decoder/traceparent"
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

// message reads a logical message. The tailer's heartbeats (not
// transactional) and the applications' traceparents (transactional, see
// TraceparentPrefix) mean something to it: other prefixes, a heartbeat
// whose content is not a time and a traceparent that is not one are
// passed over, as a row of an unpublished table would be.
func (d *Decoder) message(r *reader, sink Output) error {
	var xid uint32
	if d.inStream {
		xid = r.u32()
	}
	flags := r.u8()
	lsn := pglogrepl.LSN(r.u64())
	prefix := r.cstring()
	content := r.bytes(int(r.u32()))
	if r.err != nil {
		return r.fail("message")
	}
	transactional := flags&1 != 0
	switch {
	case transactional && string(prefix) == TraceparentPrefix && traceparent.Valid(content):
		d.trace(xid, string(content))
	case !transactional && string(prefix) == HeartbeatPrefix:
		if at, ok := parseHeartbeat(content); ok {
			sink.Heartbeat(lsn, at)
		}
	}
	return nil
}

// trace makes t the trace of the rows the transaction inserts from now on.
func (d *Decoder) trace(subXid uint32, t string) {
	switch {
	case d.inStream:
		if st := d.streams[d.streamXid]; st != nil {
			st.marks = append(st.marks, traceMark{at: len(st.rows) + st.spilled, subXid: subXid, trace: t})
		}
	case d.inTx:
		d.txTrace = t
	}
}
