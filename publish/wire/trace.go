package wire

import (
	"errors"
	"strconv"
	"strings"
)

// Trace context across the hop. A message whose tokens' transactions
// carried a W3C traceparent (the application wrote it into the
// transaction, see docs/wire-format.md) has one HeaderTraceparent value
// for each distinct traceparent, in the order their first tokens appear
// in the body, and, at the same place, a HeaderTraceTokens value naming
// those tokens: 0-based indexes in body order, comma-joined, a run as
// first-last ("0-9,12"). A message of several batches (group commit)
// thus carries several; tokens of transactions without one are in none.
const (
	HeaderTraceparent = "traceparent"
	HeaderTraceTokens = "Mailroom-Trace-Tokens"
)

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

// AppendTokenIndex appends index i to a HeaderTraceTokens value dst whose
// last index is last (-1 for an empty one): a run grows as first-last.
func AppendTokenIndex(dst []byte, last, i int) []byte {
	switch {
	case last < 0:
		return strconv.AppendInt(dst, int64(i), 10)
	case i == last+1:
		// Extend the run that ends at last: drop "-last" if there is one.
		if j := strings.LastIndexAny(string(dst), ",-"); j >= 0 && dst[j] == '-' {
			dst = dst[:j]
		}
		dst = append(dst, '-')
		return strconv.AppendInt(dst, int64(i), 10)
	default:
		dst = append(dst, ',')
		return strconv.AppendInt(dst, int64(i), 10)
	}
}

// ErrTraceTokens is a HeaderTraceTokens value that does not parse, or
// names a token the message does not hold.
var ErrTraceTokens = errors.New("malformed " + HeaderTraceTokens)

// TraceTokens parses a HeaderTraceTokens value of a message of n tokens,
// calling f for each index it names.
func TraceTokens(v string, n int, f func(i int)) error {
	for part := range strings.SplitSeq(v, ",") {
		lo, hi, isRun := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 || a >= n {
			return ErrTraceTokens
		}
		b := a
		if isRun {
			if b, err = strconv.Atoi(hi); err != nil || b <= a || b >= n {
				return ErrTraceTokens
			}
		}
		for i := a; i <= b; i++ {
			f(i)
		}
	}
	return nil
}
