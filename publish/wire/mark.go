package wire

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// Mark names a stored message by what it carries: its Nats-Msg-Id, or for
// a message without one a digest of its subject and data. A sequence
// number names a place only in the stream it came from; the same mark at
// the same sequence is the same message, whichever replica answers, and
// whether the stream was restored from a backup (which keeps a message's
// sequence, subject, headers and data) or not. A stream deleted and made
// again, or restored from an older backup, holds another mark there, or
// nothing.
func Mark(subject string, h Header, data []byte) string {
	if id := h.Get(HeaderMsgID); id != "" {
		return IDMark(id)
	}
	d := sha256.New()
	d.Write([]byte(subject))
	d.Write([]byte{0})
	d.Write(data)
	return "sha256:" + hex.EncodeToString(d.Sum(nil))
}

// Anchor is a message by its place and its content (Mark): what a reader
// or the tailer recorded of a message, to find the same message again.
type Anchor struct {
	Seq  uint64 `json:"seq"`
	Mark string `json:"mark"`
}

// MarkerID begins the Nats-Msg-Id of every session marker; its mark
// (IDMark) says a message is one.
const MarkerID = "marker-"

// IsMarker reports whether a is a session marker, by its mark.
func (a Anchor) IsMarker() bool { return strings.HasPrefix(a.Mark, "id:"+MarkerID) }
