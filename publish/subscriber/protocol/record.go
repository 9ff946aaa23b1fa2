package protocol

import "time"

// MustReread reports whether the durable's record must be read again before
// a delivery is handed on: the server pinned this subscriber anew
// (pinChanged), or it held nothing and was idle longer than a second (a
// standby woken, or a subscriber before it on the durable died), so
// another subscriber may have written the record since.
func MustReread(pinChanged, holding bool, idle time.Duration) bool {
	return pinChanged || !holding && idle > time.Second
}

// Reread is what a subscriber makes of the record read again.
type Reread uint8

const (
	// TakenOver: another subscriber wrote the record while this one
	// held messages; it delivers them now, and this one stops.
	TakenOver Reread = iota + 1
	// KeepOwn: nobody wrote since this subscriber did; its own record,
	// with what it decided since, is the record.
	KeepOwn
	// Merge: another wrote, and this one holds nothing: the record read,
	// with what this one finished and had not saved, is the record.
	Merge
)

// AfterReread decides on the record read again: holding, this
// subscriber has messages in hand; mine, the record is at the revision
// this subscriber last read or wrote.
func AfterReread(holding, mine bool) Reread {
	switch {
	case mine:
		return KeepOwn
	case holding:
		return TakenOver
	}
	return Merge
}

// MaxDoneUnsaved is how many batches a serial reader (a pipe's, each
// batch done once it took the next) may finish before the record that
// says so is saved: one, so that a fault costs at most that batch, the
// one the reader holds and the one in its pipe (with 4, a pinned pair
// under cluster faults wrote up to 6-9 batches again at one fault). The
// price, a save per batch of a backlog's many-batch messages: a reader
// that takes lines as fast as they come gets 680-700 batches a second
// against 3,400-3,700 with 4 (BenchmarkSubscriberPipeBacklog,
// docs/bench); a sender that mails each line spends longer on it than
// the save.
const MaxDoneUnsaved = 1

// SaveFirst reports whether the record must be saved before a reader
// gets its next batch: a serial reader with doneUnsaved batches finished
// since the last save. A batch handed past a save that waits would be
// read unrecorded, and written again by a subscriber that takes over.
func SaveFirst(serial bool, doneUnsaved int) bool {
	return serial && doneUnsaved >= MaxDoneUnsaved
}

// InProgressEvery is how often the messages in hand are said to be in
// progress: a third of the consumer's own ack wait, the one the server
// redelivers after, else of the subscriber's setting, else of def (a
// durable made with --ack-wait 3s, run without the flag, had every token
// written 2-4 times when the flag's was used).
func InProgressEvery(consumer, setting, def time.Duration) time.Duration {
	for _, d := range []time.Duration{consumer, setting, def} {
		if d > 0 {
			return d / 3
		}
	}
	return 0
}

// KeepPinEvery is how often a subscriber holding messages asks the
// server for none, naming its pin, so that a slow sink keeps the pin: a
// quarter of the pinned TTL (0: no pin to keep). The server lets go of a
// pin that asked for nothing within the TTL.
func KeepPinEvery(pinnedTTL time.Duration) time.Duration {
	return max(pinnedTTL, 0) / 4
}

// PullExpiry is how long a pull request waits on the server: 5 s (the
// iterator asks again when two of its heartbeats, half the expiry
// apart, are missed: a pull the server did not keep then costs 5 s, not
// the default 30 s); under a pin (pinnedTTL > 0), at most half the TTL,
// so that the pinned subscriber keeps its pin by asking again, idle or
// not.
func PullExpiry(pinnedTTL time.Duration) time.Duration {
	if pinnedTTL > 0 {
		return min(5*time.Second, pinnedTTL/2)
	}
	return 5 * time.Second
}

// HeldAtLast is what the stream holds at the sequence the durable's record
// saw last.
type HeldAtLast uint8

const (
	// SameMessage: the message the record saw there: the record is this
	// stream's, whichever replica answers and whatever creation time.
	SameMessage HeldAtLast = iota
	// Removed: no message there, and the stream goes on beyond it (a
	// limit's trim, a purge, a delete): the chain tells at the next
	// message whether what was removed had been read.
	Removed
	// OtherMessage: another message, or none with nothing beyond: the
	// stream was deleted and made again, or restored from an older
	// backup, and the record's sequences name places of another stream.
	OtherMessage
	// Unanchored: the record names no message, only an ack floor (a
	// standby given nothing read the consumer's): a floor names a place
	// in no stream in particular, and outlives the consumer it was read
	// from (the simulation: a standby pinned on a stream made again
	// acknowledged its first messages unwritten, below the old floor).
	Unanchored
)

// OnRecord is what becomes of the durable's record held against the
// stream.
type OnRecord uint8

const (
	// KeepRecord: the record is the stream's.
	KeepRecord OnRecord = iota
	// DropRecord: the record is of another stream and is dropped; the
	// consumer's own position, the stream's first message, or the sink's
	// own record says where to go on.
	DropRecord
	// RefuseRecord: the record is of another stream and nothing says
	// where to go on: the consumer made at its sequences would skip this
	// stream's messages, so the subscriber stops, naming --from-start.
	RefuseRecord
)

// CheckRecord decides on the durable's record, by what the stream holds
// at the sequence it saw last (at), whether the consumer is missing from
// the server, whether the subscriber asks for the stream from its first
// message (fromStart), and whether its sink keeps a record of its own
// (keepsOwn).
func CheckRecord(at HeldAtLast, missing, fromStart, keepsOwn bool) OnRecord {
	switch at {
	case Unanchored:
		// Where to go on is MakeAt's: the consumer's own position, the
		// sink's, or the configuration's.
		return DropRecord
	case SameMessage, Removed:
		return KeepRecord
	}
	if missing && !fromStart && !keepsOwn {
		return RefuseRecord
	}
	return DropRecord
}

// ConsumerPlace is where a consumer missing from the server is made.
type ConsumerPlace uint8

const (
	// AfterFloor: after the record's floor, the last message every
	// subscriber of the durable acknowledged.
	AfterFloor ConsumerPlace = iota + 1
	// AsSinkSays: where the sink's own record says, from the stream's
	// first message (--from-start), or refused for a consumer the
	// subscriber was bound to and saw go: nothing says where it was.
	AsSinkSays
)

// MakeAt decides where a consumer missing from the server is made: after
// the record's floor when the record names a message of this stream
// (anchored: the message it saw last, held against the stream by
// CheckRecord) and the sink keeps no record of its own (keepsOwn). A
// floor alone names no stream: a standby that had read the old
// consumer's ack floor and been given nothing made the consumer of a
// stream made again after it (the simulation: the new stream's first
// message never delivered).
func MakeAt(anchored, keepsOwn bool) ConsumerPlace {
	if anchored && !keepsOwn {
		return AfterFloor
	}
	return AsSinkSays
}
