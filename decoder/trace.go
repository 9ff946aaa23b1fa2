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

// TraceparentLen is the length of a version-00 traceparent.
const TraceparentLen = 55

// ValidTraceparent reports whether v is a W3C traceparent of version 00:
// 00-, 32 and 16 lowercase hex digits (neither all zeros) and 2 of flags.
// Anything else is passed over, never carried: the value goes into
// message headers, rows and logs.
func ValidTraceparent[T string | []byte](v T) bool {
	if len(v) != TraceparentLen || v[0] != '0' || v[1] != '0' || v[2] != '-' || v[35] != '-' || v[52] != '-' {
		return false
	}
	for _, f := range [][2]int{{3, 35}, {36, 52}, {53, 55}} {
		zero := true
		for i := f[0]; i < f[1]; i++ {
			c := v[i]
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
				return false
			}
			zero = zero && c == '0'
		}
		if zero && f[1]-f[0] > 2 {
			return false
		}
	}
	return true
}
