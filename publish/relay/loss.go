package relay

import (
	"slices"

	"github.com/mailroom/tailer/publish/wire"
)

// Judging what a look at the stream found: whether it lost batches the
// tailer stored there (deleted, purged, made again), what a limit of the
// stream's own may have removed, and the counts a quiet look keeps.

// replaced is the refusal of a stream made again since it was recorded
// (created at another time, and holding nothing the tailer stored).
func (r *Relay) replaced(created, recorded string) Refusal {
	return Refusal{Fact: StreamReplaced, Err: &StreamLoss{Fact: StreamReplaced, Stream: r.stream.Name, Created: created, Recorded: recorded}}
}

// lost judges what a check found of the stream: the refusal of a stream
// that lost batches (a batch it was known by gone, made again since the
// session opened it holding messages with nothing stored yet to know it
// by, or batches purged or deleted), or whether to look again, quietly
// (again: messages gone, which only a quiet look can tell batches from
// session markers among), or neither. What the stream held is kept as
// the last seen when it lost nothing.
func (r *Relay) lost(ev StreamLook) (ref Refusal, again, refused bool) {
	loss := &StreamLoss{Stream: r.stream.Name}
	// Messages gone that the configuration may have removed, now or
	// before this look (a limit taken off since it trimmed), say nothing.
	trims := ev.Seen.Trims || r.seen.Trims
	// The message the session opened the stream at says only whether it
	// is the same stream; gone, it was no anchor of the tailer's.
	opened := r.opened()
	openedGone := len(opened) == 1 && slices.Contains(ev.Missing, opened[0])
	ev.Missing = slices.DeleteFunc(slices.Clone(ev.Missing), func(a wire.Anchor) bool { return slices.Contains(opened, a) })
	batch, marker := r.gone(ev, trims)
	if past := pastLast(ev); past.Seq != 0 && batch.Seq == 0 {
		// No removal lowers a stream's last sequence (a purge, a limit
		// or a delete leaves it): a stream whose last is below a message
		// the tailer stored there was made again or restored from an
		// older backup, whatever its batches number now (make sim seed
		// 1621335431: a restore holding as many batches as the record
		// counted, other ones, and a resync's marker gone).
		batch = past
	}
	// A marker gone at or past the first sequence went by no limit, nor
	// more messages than a limit of messages could have removed.
	purged := Purged(ev.Seen, r.seen, r.rec.StreamSeq, r.judged)
	removed := marker.Seq != 0 || purged && (!trims || beyondLimits(r.seen, ev.Seen))
	switch {
	case batch.Seq != 0:
		loss.Fact, loss.Anchor = StreamLostAnchor, batch
	case ev.Created != r.stream.Created && r.anchors.with(r.stored).Unanchored() && r.stream.LastSeq > 0 && (len(opened) == 0 || openedGone):
		loss.Fact, loss.Created, loss.Recorded = StreamReplaced, ev.Created, r.stream.Created
	case removed && !ev.Seen.Quiet:
		return Refusal{}, true, false
	case removed && marker.Seq != 0 && !r.count.valid:
		// A message it stored gone, the batches beside it not counted.
		loss.Fact, loss.Anchor = StreamLostAnchor, marker
	case removed && (!r.count.valid || r.count.removed(ev) > 0):
		loss.Fact, loss.Since = StreamPurged, r.rec.StreamSeq
		if r.count.valid {
			loss.Batches = r.count.removed(ev)
		}
	default:
		if r.anchors.with(r.stored).Unanchored() {
			// Empty when the session opened it, and nothing stored since:
			// whichever stream answers (another replica, or one made again)
			// lost nothing, and is the one the session publishes to.
			r.stream.Created = ev.Created
		}
		r.seen, r.judged = ev.Seen, true
		switch {
		case trims:
			r.count = batchCount{}
		case ev.Seen.Quiet:
			r.count = batchCount{valid: true, batches: ev.Seen.Batches, stored: ev.Stored}
		}
		return Refusal{}, false, false
	}
	return Refusal{Fact: loss.Fact, Err: loss}, false, true
}

// beyondLimits reports whether more messages are gone between two looks
// than limits of messages (Seen.Keeps) could have removed: a stream that
// kept at most k messages removed only those past k, and only the
// oldest, never one within (a purge of the batches' subject under a limit
// since taken off: make sim seed 2174698862). Limits of bytes, or of
// messages per subject, set no such bound: all that went may be theirs.
func beyondLimits(before, now Seen) bool {
	keeps := uint64(0)
	for _, s := range []Seen{before, now} {
		switch {
		case !s.Trims:
		case s.Keeps == 0:
			return false
		case keeps == 0 || s.Keeps < keeps:
			keeps = s.Keeps
		}
	}
	if now.Last < before.Last {
		return false
	}
	if now.Deleted > before.Deleted {
		return true
	}
	had := before.holds() + (now.Last - before.Last)
	gone := had - min(had, now.holds())
	removable := had - min(had, keeps)
	return gone > removable
}

// batchCount is a quiet look the stream's batches are counted from.
type batchCount struct {
	valid           bool
	batches, stored uint64
}

// removed is how many batch messages a quiet look finds gone since the
// count: those the stream held then and the session stored since, less
// those it holds now.
func (c batchCount) removed(ev StreamLook) uint64 {
	had := c.batches + ev.Stored - c.stored
	if ev.Seen.Batches >= had {
		return 0
	}
	return had - ev.Seen.Batches
}

// pastLast is the first anchor the stream no longer holds past its last
// sequence (zero: none; a look that could not read the stream's state
// says nothing).
func pastLast(ev StreamLook) wire.Anchor {
	for _, a := range ev.Missing {
		if ev.Seen.Known && a.Seq > ev.Seen.Last {
			return a
		}
	}
	return wire.Anchor{}
}

// gone sorts the anchors the stream no longer holds: the first that may
// be a batch, and the first session marker (by its mark: its loss alone
// says nothing of the batches). One below the stream's first sequence
// while its configuration removes old messages went by those limits.
func (r *Relay) gone(ev StreamLook, trims bool) (batch, marker wire.Anchor) {
	for _, a := range ev.Missing {
		switch {
		case trims && a.Seq < ev.Seen.First:
		case a.IsMarker():
			if marker.Seq == 0 {
				marker = a
			}
		case batch.Seq == 0:
			batch = a
		}
	}
	return batch, marker
}

// Purged reports whether a stream whose configuration removes no
// message, seen now, lost messages since it was seen before (judged: a
// check found it lost nothing then): more messages gone within, or its
// first sequence moved past the first it held, or, empty then, past the
// next one stored (the session's own markers and batches, stored into a
// stream seen empty, purged before the next look: make sim seed
// 2174698862); or, before a judged look, its first sequence past the
// messages of the incarnation (which took the stream over after since).
func Purged(now, before Seen, since uint64, judged bool) bool {
	return !judged && pastSince(now, since) || before.Known && now.First > before.next() || now.Deleted > before.Deleted
}

// next is the first sequence s still holds, or, empty, the one the next
// message stored takes.
func (s Seen) next() uint64 {
	if s.held() {
		return s.First
	}
	return s.Last + 1
}

// pastSince reports whether the stream's first message is past the first
// the incarnation published (it took the stream over after since).
func pastSince(now Seen, since uint64) bool {
	return now.First > since+1
}
