package wal

import "strconv"

// LSN is a WAL position, as PostgreSQL numbers it (pglogrepl.LSN's
// value, without the replication client).
type LSN uint64

// String formats l as PostgreSQL does: two hexadecimal halves, X/Y.
func (l LSN) String() string {
	return string(appendLSN(nil, l))
}

func appendLSN(dst []byte, l LSN) []byte {
	dst = appendUpperHex(dst, uint64(l)>>32)
	dst = append(dst, '/')
	return appendUpperHex(dst, uint64(l)&0xffffffff)
}

// Position identifies a row in the WAL: the commit LSN of its transaction
// and its index among the transaction's inserts into the tokens table. It is
// stable across replays of the same slot, which makes it usable as an
// idempotency key.
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

// Compare returns -1, 0 or +1 as p comes before, at or after q in commit
// order.
func (p Position) Compare(q Position) int {
	switch {
	case p.Less(q):
		return -1
	case q.Less(p):
		return 1
	}
	return 0
}

// IsZero reports whether p is the zero position (before any row).
func (p Position) IsZero() bool { return p.Commit == 0 && p.Index == 0 }

// String formats p as LSN:index, e.g. "0/16B3748:3".
func (p Position) String() string {
	return p.Commit.String() + ":" + strconv.FormatUint(uint64(p.Index), 10)
}

// AppendText appends the String form of p to dst without allocating.
func (p Position) AppendText(dst []byte) []byte {
	dst = appendUpperHex(dst, uint64(p.Commit)>>32)
	dst = append(dst, '/')
	dst = appendUpperHex(dst, uint64(p.Commit)&0xffffffff)
	dst = append(dst, ':')
	return strconv.AppendUint(dst, uint64(p.Index), 10)
}

// appendUpperHex matches the %X formatting PostgreSQL and pglogrepl use for
// LSNs.
func appendUpperHex(dst []byte, v uint64) []byte {
	const digits = "0123456789ABCDEF"
	var buf [16]byte
	i := len(buf)
	for {
		i--
		buf[i] = digits[v&0xf]
		v >>= 4
		if v == 0 {
			break
		}
	}
	return append(dst, buf[i:]...)
}
