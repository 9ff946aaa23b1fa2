package wire

import (
	"fmt"
	"unicode/utf8"

	"github.com/mailroom/tailer/decoder/action"
)

// Header names of a published batch.
const (
	HeaderMsgID = "Nats-Msg-Id"
	// HeaderCount is how many tokens the body holds.
	HeaderCount = "Mailroom-Count"
	// HeaderTokenIDs holds the token ids, comma-joined in body order.
	HeaderTokenIDs = "Mailroom-Token-Ids"
	// HeaderTokenKeys holds each token's key (package token's AppendKey),
	// comma-joined in body order.
	HeaderTokenKeys = "Mailroom-Token-Keys"
	// HeaderKeyID names the signing key (package token's Ring) that signed
	// the message's tokens.
	HeaderKeyID = "Mailroom-Key-Id"
	// HeaderFormat is the body's Format.
	HeaderFormat = "Mailroom-Format"
	// HeaderPosFirst and HeaderPosLast give the WAL positions (LSN:index)
	// of the first and last token the batch covers, published or skipped.
	HeaderPosFirst = "Mailroom-Pos-First"
	HeaderPosLast  = "Mailroom-Pos-Last"
	// HeaderResync marks a batch published by a resync from a snapshot
	// (instead of positions): the consistent point of the slot it made.
	HeaderResync = "Mailroom-Resync"
	// HeaderOrigin names the database a batch's WAL positions belong to.
	HeaderOrigin = "Mailroom-Origin"
	// HeaderIncarnation names the incarnation of the slot a batch was
	// published from (or that a resync published it for): its positions
	// mean something only to that incarnation.
	HeaderIncarnation = "Mailroom-Incarnation"
	// HeaderBatchSizes gives the number of tokens of each batch the
	// message holds, comma-joined in body order: a message carries one
	// batch, or several consecutive batches of its subject that became
	// ready together (group commit). Each is a line of its own in a line
	// body. Messages of tailers before group commit lack it: one batch.
	HeaderBatchSizes = "Mailroom-Batch-Sizes"

	// HeaderPrev is the mark (Mark) of the batch message before this one
	// on its subject, ChainStart on the first: each subject's batches form
	// a chain that a reader follows by content (Chain), so that messages
	// removed before it read them (a purge of the subject, a delete, a
	// limit) are seen where they were, in whatever stream it reads.
	// HeaderPrevSeq is that message's stream sequence (0 with
	// ChainStart), known as the message is published since every publish
	// expects the stream's last sequence. Messages of tailers before the
	// chain lack both.
	HeaderPrev    = "Mailroom-Prev"
	HeaderPrevSeq = "Mailroom-Prev-Seq"

	// HeaderFence is on a session marker (MarkerSubject), never on a
	// batch: "N/K", the marker's place among the K a streaming session
	// published before its first batch. See MarkerSubject.
	HeaderFence = "Mailroom-Fence"
	// HeaderInFlight, on a marker, is the most messages the session that
	// published it keeps awaiting their PubAck.
	HeaderInFlight = "Mailroom-In-Flight"
	// HeaderWindowAfter and HeaderWindowFloor, on a marker, say what the
	// session found on the stream: every message before the marker that
	// holds a token past WAL position HeaderWindowAfter (the slot's
	// confirmed position when the session started) is at stream sequence
	// HeaderWindowFloor or later.
	HeaderWindowAfter = "Mailroom-Window-After"
	HeaderWindowFloor = "Mailroom-Window-Floor"
)

// MarkerSubject is where the tailer publishes its session markers, beside
// the batches of subject: empty messages, chained to the stream's last
// sequence, with which every streaming session starts (a few, so that a
// killed or frozen earlier session's publishes still on their way are
// refused: their expected last sequence no longer matches). Consumers skip
// them (IsMarker); a consumer that filters on the batches' subjects never
// sees them.
func MarkerSubject(subject string) string { return subject + "._session" }

// DataSubjects are the subjects batches of subject can be on: subject
// itself, and its per-action lanes (MAILROOM_SUBJECT_PER_ACTION), whichever
// way it was set when they were published; never the markers' subject
// (MarkerSubject), which a consumer filtering on these never sees, nor
// counts as pending.
func DataSubjects(subject string) []string {
	out := []string{subject}
	for _, label := range action.Labels() {
		out = append(out, LaneSubject(subject, label))
	}
	return out
}

// LaneSubject is the subject of the batches of the action of label
// (action.Actions) with MAILROOM_SUBJECT_PER_ACTION.
func LaneSubject(subject, label string) string { return subject + "." + label }

// Header is what the helpers below read of a message's headers (a
// nats.Header satisfies it).
type Header interface {
	Get(key string) string
}

// IsMarker reports whether a message is a session marker.
func IsMarker(h Header) bool { return h.Get(HeaderFence) != "" }

// IsBatch reports whether a message is one of the tailer's batches (rather
// than a marker, or something another publisher put on the subject).
func IsBatch(h Header) bool { return h.Get(HeaderTokenKeys) != "" && h.Get(HeaderCount) != "" }

// Format is the body format of a published batch.
type Format uint8

const (
	// FormatLine is the mailroom collector's batch lines without the last
	// newline: per batch, action,email,login,token,code for every token,
	// comma-joined; batches separated by a newline.
	FormatLine Format = iota
	// FormatJSON is {"batch": id, "key_id": id, "tokens": [{id, action,
	// email, login, token, key, code, expires_at}, ...], "batch_sizes": [n,
	// ...]}: the tokens of every batch of the message in one array, how many
	// belong to each batch, and the key that signed them.
	FormatJSON
)

// ParseFormat parses "line" or "json".
func ParseFormat(s string) (Format, error) {
	switch s {
	case "line":
		return FormatLine, nil
	case "json":
		return FormatJSON, nil
	}
	return 0, fmt.Errorf("%q is not a format: use line or json", s)
}

func (f Format) String() string {
	if f == FormatJSON {
		return "json"
	}
	return "line"
}

// Unsafe says, in the words of the logs, what wire.LineSafe refuses.
const Unsafe = "a comma, a control character (C0, DEL, C1 such as NEL), U+2028 or U+2029, or bytes that are not UTF-8, or exceeds 254 bytes"

// MaxLineField is the most bytes the mailroom sender reads in one field of
// a line.
const MaxLineField = 254

// LineSafe reports whether a field can go into a collector line. The
// mailroom sender splits rows at commas and lines at newlines, so a field
// holding either would shift every field after it, or forge rows; a C
// string ends at NUL; and it reads at most MaxLineField bytes. The rest of
// what it refuses is what some reader of the line or of the mail built
// from it takes for a break or a control: the other C0 controls and DEL
// (a header folded at a tab or a bare CR, a terminal's escapes), the C1
// controls (NEL, U+0085, ends a line for Unicode-aware readers), U+2028
// and U+2029 (line and paragraph separators), and bytes that are not
// UTF-8, which a reader decoding Latin-1 can take for C1 controls.
func LineSafe[T string | []byte](field T) bool {
	if len(field) > MaxLineField {
		return false
	}
	for i := 0; i < len(field); {
		c := field[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f || c == ',' {
				return false
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(string(field[i:min(i+utf8.UTFMax, len(field))]))
		if r == utf8.RuneError && size <= 1 || r >= 0x80 && r <= 0x9f || r == 0x2028 || r == 0x2029 {
			return false
		}
		i += size
	}
	return true
}
