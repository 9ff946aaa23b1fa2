package sim

// The faults a schedule may put in: what each does to the world (the
// servers' models), the operator's hand included, and what it makes the
// tailer lose or refuse by rights.

import (
	"pgregory.net/rapid"

	"github.com/mailroom/tailer/decoder/wal"
	"github.com/mailroom/tailer/publish/relay"
)

// fault injects one of the faults, while the schedule has some left.
func (m *machine) fault(t *rapid.T) {
	if m.faults == 0 {
		t.Skip("no faults left")
	}
	m.faults--
	w := m.w
	kind := rapid.SampledFrom(m.kinds).Draw(t, "fault")
	before, held := w.stream.keys(), w.stream.marks()
	kind.do(t, w)
	w.say("fault: %s", kind.name)
	if kind.config {
		// What the configuration removes is no loss to refuse.
		return
	}
	w.noteLost(before)
	w.noteRemoved(held)
}

// noteRemoved says a refusal may stand once a fault removed a message the
// stream held, a marker too: the tailer cannot tell which messages went
// with it, nor, on a stream whose limits remove messages, a purge from
// them.
func (w *world) noteRemoved(held map[uint64]string) {
	now := w.stream.marks()
	for seq, mark := range held {
		if now[seq] != mark {
			w.causes = true
		}
	}
}

// noteLost marks tokens gone from the stream as lost (JetStream
// acknowledged storing them, whether or not their session took the
// PubAck): a refusal must stand for them. On a stream whose limits remove messages,
// a removal is no loss the tailer can tell from its limits' (which remove
// messages whether a consumer read them or not, as documented): only a
// replay they reach is refused.
func (w *world) noteLost(before map[string]int) {
	after := w.stream.keys()
	for k := range before {
		switch {
		case after[k] > 0:
		case w.stream.trims():
			w.trimmed[k], w.gone[k] = true, true
		default:
			w.lost, w.gone[k] = true, true
		}
	}
	w.causes = w.causes || w.lost
}

type faultKind struct {
	name string
	do   func(t *rapid.T, w *world)
	// config: the operator's configuration changed, nothing removed by
	// hand (what its limits remove, a consumer may have read).
	config bool
}

var faultKinds = []faultKind{
	{name: "purge", do: func(_ *rapid.T, w *world) { w.stream.purge("") }},
	{name: "purge of the batches' subject", do: func(_ *rapid.T, w *world) { w.stream.purge("b") }},
	{name: "purge of the session markers' subject", do: func(_ *rapid.T, w *world) { w.stream.purge("b._session") }},
	{name: "the stream's limits edited", do: func(t *rapid.T, w *world) {
		before, held := w.stream.keys(), len(w.stream.msgs)
		switch rapid.IntRange(0, 2).Draw(t, "limits now") {
		case 0:
			w.stream.limit(0, false)
		case 1:
			w.stream.limit(12, false)
		default:
			w.stream.limit(1000, true)
		}
		w.limited = w.limited || len(w.stream.msgs) < held
		w.noteTrimmed(before)
		if w.stream.trims() {
			// Messages removed before the limit was set, and not yet
			// judged, are what it could have removed: the tailer cannot
			// tell them from its work (docs/faults.md, "What it cannot
			// see"; the audit finds them).
			for k := range w.gone {
				w.trimmed[k] = true
			}
		}
	}, config: true},
	{name: "a message deleted", do: func(t *rapid.T, w *world) {
		if seqs := w.stream.seqs(); len(seqs) > 0 {
			w.stream.deleteMsg(rapid.SampledFrom(seqs).Draw(t, "deleted"))
		}
	}},
	{name: "the stream made again", do: func(_ *rapid.T, w *world) {
		// Refused even when it held nothing yet: a stream of another
		// creation time, without a message the tailer stored to know it
		// by, may have lost any.
		discardNew := w.stream.discardNew
		w.stream, w.causes = newStream(w.stream.name, w.stream.maxMsgs, &w.made), true
		w.stream.discardNew = discardNew
	}},
	{name: "a backup taken", do: func(_ *rapid.T, w *world) {
		w.backups, w.backupAt = append(w.backups, w.stream.clone()), append(w.backupAt, w.anchorWrites)
	}},
	{name: "the stream restored from its last backup", do: func(_ *rapid.T, w *world) {
		// A stream made again, too: refused unless it holds what the
		// tailer knows it by.
		n := len(w.backups)
		if n == 0 {
			return
		}
		before := w.stream.keys()
		w.stream, w.causes = w.stream.restore(w.backups[n-1]), true
		if w.backupAt[n-1] == w.anchorWrites || w.holdsRecord() {
			// No tailer recorded what it stored since the backup, or what
			// it recorded since is in the backup too (the markers a
			// session records before its batches go out): what it stored
			// after is lost unseen (docs/faults.md, "What it cannot see").
			for k := range before {
				if w.stream.keys()[k] == 0 {
					w.unseen[k] = true
				}
			}
		}
	}},
	{name: "a replica of the stream's own", do: func(_ *rapid.T, w *world) { w.stream.replicate() }},
	{name: "another replica leads", do: func(_ *rapid.T, w *world) {
		w.stream.leader = (w.stream.leader + 1) % len(w.stream.replicas)
	}},
	{name: "the publication changed and changed back", do: func(t *rapid.T, w *world) {
		w.causes = true
		w.db.breakPublication()
		w.db.commit(rapid.IntRange(1, 2).Draw(t, "tokens"))
		w.db.broken = false
	}},
	{name: "the slot lost", do: func(_ *rapid.T, w *world) {
		if w.db.slot != nil {
			w.db.slot.lost, w.causes = true, true
		}
	}},
	{name: "the slot advanced by another process", do: func(_ *rapid.T, w *world) {
		// pg_replication_slot_advance, or a tailer of another schema
		// configured with the same slot: what it skipped never reaches
		// this stream from the slot.
		if w.db.slot == nil || w.db.slot.lost {
			return
		}
		for _, tx := range w.db.replay(w.db.slot.confirmed) {
			for _, k := range tx.toks {
				w.skipped[k.key] = true
			}
		}
		w.db.confirm(w.db.wal())
		w.causes = true
	}},
	{name: "a table attached to tokens holding rows", do: func(t *rapid.T, w *world) {
		w.db.attach(rapid.IntRange(1, 3).Draw(t, "rows"))
		w.causes = true
	}},
	{name: "the slot dropped", do: func(_ *rapid.T, w *world) {
		// pg_drop_replication_slot, the walsender streaming it ended first
		// (an active slot cannot be dropped), the sessions' replication
		// connections with it: its record stays, bound or as tailer
		// migrate left it, and the tokens committed since it was last
		// confirmed are in no slot.
		if w.db.slot == nil {
			return
		}
		w.db.slot, w.causes = nil, true
		for _, p := range w.procs {
			if p.s != nil {
				p.s.cut = true
			}
		}
	}},
	{name: "a failover to a standby", do: func(t *rapid.T, w *world) {
		old := w.db.origin.String()
		w.db.failover(rapid.IntRange(0, 2).Draw(t, "transactions the standby lacks"), rapid.Bool().Draw(t, "a failover slot synchronized to it"))
		// Without a slot, or with batches on the stream from WAL the
		// standby never had, a refusal may stand; a synchronized slot and
		// a stream within the standby's WAL go on.
		w.causes = w.causes || w.db.slot == nil || w.past(old, w.db.next)
		w.cutAll()
	}},
	{name: "the database's files copied", do: func(_ *rapid.T, w *world) { w.dbSnaps = append(w.dbSnaps, w.db.clone()) }},
	{name: "the database's files put back, with its slot", do: func(_ *rapid.T, w *world) {
		if n := len(w.dbSnaps); n > 0 {
			// The server restarts on them: every session's connections
			// (the lease's, the walsender's) are cut.
			tokens := w.db.tokens
			w.causes = true
			w.db = w.dbSnaps[n-1].clone()
			w.db.tokens = tokens
			w.cutAll()
		}
	}},
}

// past reports whether the stream holds, or a publish on its way will
// put there, a batch published from origin at a position past end.
func (w *world) past(origin string, end wal.LSN) bool {
	for _, f := range w.net {
		if f.m.Is == relay.Batch && f.m.Origin == origin && f.m.Last.Commit > end {
			return true
		}
	}
	return w.stream.past(origin, end, 0)
}

// pastBranch is a timeline of the database's history, and where it
// ended, that the stream holds a batch past, published after the last
// resync (ok false: none). The database put back from a copy taken
// before a failover has the history it had then.
func (w *world) pastBranch() (origin string, end wal.LSN, ok bool) {
	for tl, end := range w.db.origin.History {
		o := w.db.origin
		o.Timeline = tl
		if w.stream.past(o.String(), end, w.resyncSeq) {
			return o.String(), end, true
		}
	}
	return "", 0, false
}

// cutAll cuts every connection to the database server, the lease's too:
// it restarted, or another server took its place.
func (w *world) cutAll() {
	w.lease = nil
	for _, p := range w.procs {
		if p.s != nil {
			p.s.cut = true
		}
	}
}
