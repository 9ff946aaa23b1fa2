package decoder

// TraceparentPrefix is the prefix of the logical messages an application
// writes, transactional, into the transaction that inserts its tokens to
// have them traced: pg_logical_emit_message(true, 'mailroom_traceparent',
// '00-<trace id>-<parent id>-<flags>'), a W3C traceparent. The tokens the
// transaction inserts after it carry it (Token.Trace), and the tailer's
// spans and the published message's traceparent headers follow it.
const TraceparentPrefix = "mailroom_traceparent"

// traceMark is where a streamed transaction's trace changes: the rows
// from at on (counted as they were added, aborted subtransactions'
// included) carry trace, unless subXid was rolled back.
type traceMark struct {
	at     int
	subXid uint32
	trace  string
}
