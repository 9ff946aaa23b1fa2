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
