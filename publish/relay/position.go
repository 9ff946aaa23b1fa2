package relay

import (
	"strconv"
	"strings"
)

// LSN is a WAL position.
type LSN uint64

// String formats l as PostgreSQL does: two hexadecimal halves, X/Y.
func (l LSN) String() string {
	return strings.ToUpper(strconv.FormatUint(uint64(l)>>32, 16) + "/" + strconv.FormatUint(uint64(l)&0xffffffff, 16))
}

// Position is a token's place in the WAL: its transaction's commit and
// its index among the transaction's tokens.
type Position struct {
	Commit LSN
	Index  uint32
}

// Less reports whether p comes before q in commit order.
func (p Position) Less(q Position) bool {
	if p.Commit != q.Commit {
		return p.Commit < q.Commit
	}
	return p.Index < q.Index
}

// Compare returns -1, 0 or +1 as p comes before, at or after q.
func (p Position) Compare(q Position) int {
	switch {
	case p.Less(q):
		return -1
	case q.Less(p):
		return 1
	}
	return 0
}

// String formats p as LSN:index.
func (p Position) String() string {
	return p.Commit.String() + ":" + strconv.FormatUint(uint64(p.Index), 10)
}
