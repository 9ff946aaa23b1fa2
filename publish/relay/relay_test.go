package relay

import (
	"errors"
	"fmt"
	"github.com/mailroom/tailer/decoder/wal"
	"github.com/mailroom/tailer/publish/wire"
	"strings"
	"testing"
	"time"
)

// Scenario tests, in the manner of etcd's raft: a Relay stepped through
// one session after another with what each command found, its commands
// compared with the ones the scenario calls for.

// cmds prints commands as the scenarios spell them: their types and
// fields, errors by their words.
func cmds(cs []Command) string {
	var b []string
	for _, c := range cs {
		b = append(b, strings.TrimPrefix(fmt.Sprintf("%T%+v", c, c), "relay."))
	}
	return strings.Join(b, " ")
}

// step steps r with ev and wants the commands want spells.
func step(t *testing.T, r *Relay, ev Event, want string) []Command {
	t.Helper()
	got := r.Step(ev)
	if cmds(got) != want {
		t.Fatalf("after %T%+v:\n got %s\nwant %s", ev, ev, cmds(got), want)
	}
	return got
}

var (
	here    = Origin{SystemID: "7", Timeline: 1, Database: "mailroom"}
	slotAt  = Slot{Present: true, Confirmed: 0x100}
	boundAt = SlotRecord{Exists: true, Incarnation: "i1", Bound: true, StreamName: "S", StreamCreated: "t1"}
	headAt  = StreamHead{Name: "S", Created: "t1", Replicas: 1, Seen: Seen{Known: true}}
	seen0   = Seen{Known: true}
)

// open steps a relay to the point where it inspects the slot.
func open(t *testing.T, r *Relay) {
	t.Helper()
	step(t, r, Start{}, "Open{}")
	step(t, r, Opened{}, "Inspect{}")
}

// toResume steps a relay through a session of rec, slot and head whose
// stream lost nothing, up to its Resume.
func toStream(t *testing.T, r *Relay, rec SlotRecord, head StreamHead) {
	t.Helper()
	open(t, r)
	step(t, r, Inspected{Record: rec, Slot: slotAt}, "Claim{}")
	step(t, r, Claimed{Head: head, Record: rec}, "LookAtStream{Anchors:[] Quiet:false}")
	step(t, r, StreamLook{Created: head.Created, Seen: head.Seen},
		fmt.Sprintf("RecordAnchor{Anchor:{Seq:0 Mark:} Seen:%+v Stream:{Name: Created:}} Resume{Owner:{Origin:/0/ Incarnation:i1 Since:0 Legacy:false After:0/100 InFlight:1}}", head.Seen.recordable()))
	step(t, r, Resumed{}, "Publish{}")
}

// A first start: no slot, no record, an empty stream. The slot is made,
// the stream bound, recorded and resumed.
func TestFirstStart(t *testing.T) {
	r := New(Settings{Stream: "S"})
	open(t, r)
	step(t, r, Inspected{}, "ReadHead{}")
	step(t, r, HeadRead{Head: StreamHead{Name: "S"}}, "MakeSlot{}")
	step(t, r, SlotMade{Record: SlotRecord{Exists: true, Incarnation: "i1", Bound: true}, Slot: slotAt}, "Claim{}")
	step(t, r, Claimed{Head: headAt, Record: SlotRecord{Exists: true, Incarnation: "i1", Bound: true}}, "LookAtStream{Anchors:[] Quiet:false}")
	step(t, r, StreamLook{Created: "t1", Seen: seen0},
		"Resume{Owner:{Origin:/0/ Incarnation:i1 Since:0 Legacy:false After:0/100 InFlight:1}}")
	step(t, r, Resumed{WAL: 0x200, Anchors: Anchors{Last: wire.Anchor{Seq: 1, Mark: "m1"}}},
		"RecordAnchor{Anchor:{Seq:1 Mark:m1} Seen:{Known:true First:0 Last:0 Deleted:0 Batches:0 Trims:false Keeps:0 Quiet:false} Stream:{Name:S Created:t1}} Publish{}")
	// Events of another phase are passed over.
	step(t, r, Resumed{}, "")
	step(t, r, Start{}, "")
	step(t, r, Ended{End: EndStopped}, "Exit{Err:<nil>}")
}

// A slot that is missing is made only when nothing says one existed.
func TestMissingSlot(t *testing.T) {
	for _, tc := range []struct {
		name string
		rec  SlotRecord
		head StreamHead
		auto bool
		want string
	}{
		{"recorded", SlotRecord{Exists: true, Incarnation: "i1"}, StreamHead{}, false, "Refuse{Refusal:slot_dropped Say:true} Wait{Delay:5s Err:<nil> Say:false}"},
		{"recorded, auto resync", SlotRecord{Exists: true, Incarnation: "i1"}, StreamHead{}, true, "Resync{Refusal:slot_dropped}"},
		{"batches of an unrecorded slot", SlotRecord{}, StreamHead{LastSeq: 4}, false, "Refuse{Refusal:slot_unrecorded Say:true} Wait{Delay:5s Err:<nil> Say:false}"},
		{"another database's stream", SlotRecord{}, StreamHead{LastSeq: 4, Foreign: errors.New("from elsewhere")}, false, "Refuse{Refusal:from elsewhere Say:true} Wait{Delay:5s Err:<nil> Say:false}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New(Settings{AutoResync: tc.auto})
			open(t, r)
			step(t, r, Inspected{Record: tc.rec}, "ReadHead{}")
			step(t, r, HeadRead{Head: tc.head}, tc.want)
		})
	}
}

// What the inspection finds refuses the slot, in order: the schema, the
// publication (which marks the stream as lacking inserts), the record's
// word, a resync unfinished, a refusal recorded, the slot.
func TestInspectionRefuses(t *testing.T) {
	recorded := Refusal{Fact: StreamPurged, Err: &RecordedRefusal{Said: "purged, said before"}}
	for _, tc := range []struct {
		name string
		ev   Inspected
		auto bool
		want string
	}{
		{"schema", Inspected{Schema: errors.New("no column secret"), Publication: errors.New("p"), Record: boundAt, Slot: slotAt}, false,
			"Refuse{Refusal:no column secret Say:true} Wait{Delay:5s Err:<nil> Say:false}"},
		{"publication", Inspected{Publication: errors.New("no tokens table"), Record: boundAt, Slot: slotAt}, false,
			"MarkResyncNeeded{} Refuse{Refusal:no tokens table Say:true} Wait{Delay:5s Err:<nil> Say:false}"},
		{"resync needed", Inspected{Record: SlotRecord{Exists: true, ResyncNeeded: true}, Slot: slotAt}, false,
			"Refuse{Refusal:resync_needed Say:true} Wait{Delay:5s Err:<nil> Say:false}"},
		{"resync needed, auto", Inspected{Record: SlotRecord{Exists: true, ResyncNeeded: true}, Slot: slotAt}, true, "Resync{Refusal:resync_needed}"},
		{"resync pending", Inspected{Record: SlotRecord{Exists: true, ResyncPending: true}, Slot: slotAt}, false,
			"Refuse{Refusal:resync_pending Say:true} Wait{Delay:5s Err:<nil> Say:false}"},
		{"recorded refusal", Inspected{Record: SlotRecord{Exists: true, Refused: recorded}, Slot: slotAt}, true,
			"Refuse{Refusal:purged, said before Say:true} Wait{Delay:5s Err:<nil> Say:false}"},
		{"another's slot", Inspected{Record: boundAt, Slot: Slot{Present: true, Foreign: errors.New("slot of another plugin")}}, false,
			"Wait{Delay:250ms Err:slot of another plugin Say:true}"},
		{"slot lost", Inspected{Record: boundAt, Slot: Slot{Present: true, Lost: true}}, false,
			"Refuse{Refusal:slot_lost Say:true} Wait{Delay:5s Err:<nil> Say:false}"},
		{"resync needed, with its cause", Inspected{Record: SlotRecord{Exists: true, ResyncNeeded: true, ResyncCause: "the publication was altered"}, Slot: slotAt}, false,
			"Refuse{Refusal:the publication was altered Say:true} Wait{Delay:5s Err:<nil> Say:false}"},
		{"a heal asked", Inspected{Record: SlotRecord{Exists: true, Bound: true, HealAsked: true}, Slot: slotAt}, false,
			"Refuse{Refusal:heal_asked Say:true} Wait{Delay:5s Err:<nil> Say:false}"},
		{"the slot shared with another schema", Inspected{Record: boundAt, Slot: slotAt, Shared: []string{"other"}}, false,
			"Refuse{Refusal:the slot is recorded in schema other too (its tailer_slot): a tailer of each schema would stream it through its own publication, and confirm it past the other's tokens Say:true} Wait{Delay:5s Err:<nil> Say:false}"},
		{"the slot advanced past the confirm limit", Inspected{Record: SlotRecord{Exists: true, Bound: true, ConfirmLimit: 0x80}, Slot: slotAt}, false,
			"Refuse{Refusal:the slot is confirmed at 0/100, past 0/80, the furthest a tailer of this database's record of it confirmed it: another process advanced it (a tailer of another schema configured with the same MAILROOM_SLOT, or pg_replication_slot_advance), and the tokens committed in between never reached the stream Say:true} Wait{Delay:5s Err:<nil> Say:false}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New(Settings{AutoResync: tc.auto})
			open(t, r)
			step(t, r, tc.ev, tc.want)
		})
	}
}

// A stream no incarnation took over yet is taken when it is empty: by a
// new incarnation (Adopt) without a record, by the record's (Bind).
func TestTakingTheStreamOver(t *testing.T) {
	for _, tc := range []struct {
		name string
		rec  SlotRecord
		head StreamHead
		want string
	}{
		{"unrecorded slot", SlotRecord{}, headAt, "Adopt{}"},
		{"recorded, unbound", SlotRecord{Exists: true, Incarnation: "i1"}, headAt, "Bind{}"},
		{"batches on it", SlotRecord{Exists: true, Incarnation: "i1"}, StreamHead{Name: "S", LastSeq: 3}, "Refuse{Refusal:earlier_batches Say:true} Wait{Delay:5s Err:<nil> Say:false}"},
		{"another database's", SlotRecord{Exists: true, Incarnation: "i1"}, StreamHead{Name: "S", LastSeq: 3, Foreign: errors.New("foreign")},
			"Refuse{Refusal:foreign Say:true} Wait{Delay:5s Err:<nil> Say:false}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New(Settings{})
			open(t, r)
			step(t, r, Inspected{Record: tc.rec, Slot: slotAt}, "Claim{}")
			step(t, r, Claimed{Head: tc.head, Record: tc.rec}, tc.want)
		})
	}
	r := New(Settings{})
	open(t, r)
	step(t, r, Inspected{Slot: slotAt}, "Claim{}")
	step(t, r, Claimed{Head: headAt}, "Adopt{}")
	step(t, r, Bound{Record: SlotRecord{Exists: true, Incarnation: "i2", Bound: true}}, "LookAtStream{Anchors:[] Quiet:false}")
	step(t, r, StreamLook{Created: "t1", Seen: seen0}, "Resume{Owner:{Origin:/0/ Incarnation:i2 Since:0 Legacy:false After:0/100 InFlight:1}}")
}

// The stream is named in the record with the session's first markers,
// in one write, never before: a tailer killed before its markers were
// stored, followed by another creation time (another replica of the
// stream answering), finds a record naming no stream, and takes the
// stream for its own (it refused it as made again: a false refusal,
// docs/faults.md).
func TestStreamNamedWithItsMarkers(t *testing.T) {
	unnamed := SlotRecord{Exists: true, Incarnation: "i1", Bound: true}
	r := New(Settings{Stream: "S"})
	open(t, r)
	step(t, r, Inspected{Record: unnamed, Slot: slotAt}, "Claim{}")
	step(t, r, Claimed{Head: headAt, Record: unnamed}, "LookAtStream{Anchors:[] Quiet:false}")
	step(t, r, StreamLook{Created: "t1", Seen: seen0}, "Resume{Owner:{Origin:/0/ Incarnation:i1 Since:0 Legacy:false After:0/100 InFlight:1}}")
	// Killed here; the next finds the record as it was, and another
	// creation time.
	r = New(Settings{Stream: "S"})
	open(t, r)
	other := headAt
	other.Created = "t2"
	step(t, r, Inspected{Record: unnamed, Slot: slotAt}, "Claim{}")
	step(t, r, Claimed{Head: other, Record: unnamed}, "LookAtStream{Anchors:[] Quiet:false}")
	step(t, r, StreamLook{Created: "t2", Seen: seen0}, "Resume{Owner:{Origin:/0/ Incarnation:i1 Since:0 Legacy:false After:0/100 InFlight:1}}")
	step(t, r, Resumed{WAL: 0x200, Anchors: Anchors{Last: wire.Anchor{Seq: 1, Mark: "m1"}}},
		"RecordAnchor{Anchor:{Seq:1 Mark:m1} Seen:{Known:true First:0 Last:0 Deleted:0 Batches:0 Trims:false Keeps:0 Quiet:false} Stream:{Name:S Created:t2}} Publish{}")
}

// A stream whose server reports another creation time than recorded is
// the same while it holds what the tailer knows it by: an anchor, or the
// message last on it at the last clean stop (a restore taken then).
func TestStreamOfAnotherCreationTime(t *testing.T) {
	anchored := boundAt
	anchored.StreamSeq, anchored.Anchor = 2, wire.Anchor{Seq: 5, Mark: "id:5"}
	stopped := boundAt
	stopped.StreamSeq, stopped.Stopped = 2, wire.Anchor{Seq: 6, Mark: "id:6"}
	head := StreamHead{Name: "S", Created: "t2", LastSeq: 6, Replicas: 3}
	replaced := "Refuse{Refusal:stream S was deleted and made again (the server created it at t2; this slot published to one created at t1): " +
		"the batches it held are gone, acknowledged by JetStream whether or not a consumer had read them Say:true} Wait{Delay:5s Err:<nil> Say:false}"

	r := New(Settings{})
	open(t, r)
	step(t, r, Inspected{Record: anchored, Slot: slotAt}, "Claim{}")
	step(t, r, Claimed{Head: head, Record: anchored}, "LookAtStream{Anchors:[{Seq:5 Mark:id:5}] Quiet:false}")
	lost := "Refuse{Refusal:stream S no longer holds message 5 that this tailer stored on it (id:5): it was deleted and made again, restored from an older backup, or purged (of the batches' subject alone too): " +
		"the batches it held are gone, acknowledged by JetStream whether or not a consumer had read them Say:true} Wait{Delay:5s Err:<nil> Say:false}"
	step(t, r, StreamLook{Created: "t2", Missing: []wire.Anchor{{Seq: 5, Mark: "id:5"}}}, lost)

	r = New(Settings{})
	open(t, r)
	step(t, r, Inspected{Record: boundAt, Slot: slotAt}, "Claim{}")
	step(t, r, Claimed{Head: head, Record: boundAt}, replaced)

	// The message last on it at the last clean stop is one to know it by
	// (a restore of everything it held holds it); the stop is forgotten
	// once a session goes on.
	r = New(Settings{})
	open(t, r)
	step(t, r, Inspected{Record: stopped, Slot: slotAt}, "Claim{}")
	step(t, r, Claimed{Head: head, Record: stopped}, "LookAtStream{Anchors:[{Seq:6 Mark:id:6}] Quiet:false}")
	step(t, r, StreamLook{Created: "t2", Seen: Seen{Known: true, First: 1, Last: 6}},
		"RecordAnchor{Anchor:{Seq:6 Mark:id:6} Seen:{Known:true First:1 Last:6 Deleted:0 Batches:0 Trims:false Keeps:0 Quiet:false} Stream:{Name: Created:}} ClearStopped{} "+
			"Resume{Owner:{Origin:/0/ Incarnation:i1 Since:2 Legacy:false After:0/100 InFlight:2}}")
	r = New(Settings{})
	open(t, r)
	step(t, r, Inspected{Record: stopped, Slot: slotAt}, "Claim{}")
	step(t, r, Claimed{Head: head, Record: stopped}, "LookAtStream{Anchors:[{Seq:6 Mark:id:6}] Quiet:false}")
	step(t, r, StreamLook{Created: "t2", Seen: Seen{Known: true, First: 1, Last: 4}, Missing: []wire.Anchor{{Seq: 6, Mark: "id:6"}}},
		"Refuse{Refusal:stream S no longer holds message 6 that this tailer stored on it (id:6): it was deleted and made again, restored from an older backup, or purged (of the batches' subject alone too): "+
			"the batches it held are gone, acknowledged by JetStream whether or not a consumer had read them Say:true} Wait{Delay:5s Err:<nil> Say:false}")
}

// A stream whose configuration removes nothing lost messages when its
// first sequence is past the incarnation's first, or past the first it
// held when last seen, or more messages within it are gone.
func TestPurged(t *testing.T) {
	before := Seen{Known: true, First: 3, Last: 9, Deleted: 1}
	for _, tc := range []struct {
		now   Seen
		since uint64
		want  bool
	}{
		{Seen{Known: true, First: 3, Last: 12, Deleted: 1}, 2, false},
		{Seen{Known: true, First: 4, Last: 12, Deleted: 1}, 2, true},
		{Seen{Known: true, First: 3, Last: 12, Deleted: 2}, 2, true},
		{Seen{Known: true, First: 10, Last: 9}, 2, true},
		{Seen{Known: true, First: 4, Last: 12, Deleted: 1}, 3, true},
		{Seen{Known: true, First: 3, Last: 3}, 3, false},
	} {
		if got := Purged(tc.now, before, tc.since, false); got != tc.want {
			t.Errorf("Purged(%+v, %+v, %d) = %v, want %v", tc.now, before, tc.since, got, tc.want)
		}
	}
	// Seen holding one message, its first sequence moved on since.
	if !Purged(Seen{Known: true, First: 4, Last: 5}, Seen{Known: true, First: 3, Last: 3}, 3, false) {
		t.Error("a stream of one message seen before, its first sequence past it now, was not purged")
	}
	// Nothing seen before: only the incarnation's own first message counts.
	if Purged(Seen{Known: true, First: 3, Last: 9}, Seen{}, 2, false) || !Purged(Seen{Known: true, First: 4, Last: 9}, Seen{}, 2, false) {
		t.Error("with nothing seen before, a stream is purged when its first sequence is past since+1")
	}
	// Judged against a look that found nothing lost (a limit since taken
	// off had moved the first sequence past since): only what is gone
	// since that look counts.
	if Purged(Seen{Known: true, First: 5, Last: 12, Deleted: 1}, Seen{Known: true, First: 5, Last: 9, Deleted: 1}, 2, true) {
		t.Error("a first sequence past since+1, as seen by a judged look, is no purge")
	}
	if !Purged(Seen{Known: true, First: 6, Last: 12}, Seen{Known: true, First: 5, Last: 9}, 2, true) {
		t.Error("a first sequence moved on since a judged look is a purge")
	}
}

// The checks before streaming refuse a stream that lost messages; one
// whose limits remove messages is not judged by its first sequence.
func TestStreamChecks(t *testing.T) {
	rec := boundAt
	rec.StreamSeq, rec.Seen = 2, Seen{Known: true, First: 1, Last: 9}
	purged := "Refuse{Refusal:stream S no longer holds messages this slot published after sequence 2, and its configuration removes none: it was purged: " +
		"the batches it held are gone, acknowledged by JetStream whether or not a consumer had read them Say:true} Wait{Delay:5s Err:<nil> Say:false}"
	for _, tc := range []struct {
		name string
		ev   StreamLook
		want string
	}{
		{"purged", StreamLook{Created: "t1", Seen: Seen{Known: true, First: 10, Last: 9}}, purged},
		{"a message deleted", StreamLook{Created: "t1", Seen: Seen{Known: true, First: 1, Last: 9, Deleted: 1}}, purged},
		{"limits", StreamLook{Created: "t1", Seen: Seen{Known: true, First: 10, Last: 12, Trims: true}},
			"RecordAnchor{Anchor:{Seq:0 Mark:} Seen:{Known:true First:10 Last:12 Deleted:0 Batches:0 Trims:true Keeps:0 Quiet:false} Stream:{Name: Created:}} Resume{Owner:{Origin:/0/ Incarnation:i1 Since:2 Legacy:false After:0/100 InFlight:1}}"},
		{"as seen", StreamLook{Created: "t1", Seen: Seen{Known: true, First: 1, Last: 9}},
			"Resume{Owner:{Origin:/0/ Incarnation:i1 Since:2 Legacy:false After:0/100 InFlight:1}}"},
		{"made again, held nothing", StreamLook{Created: "t2", Seen: Seen{Known: true, First: 1, Last: 9}},
			"Resume{Owner:{Origin:/0/ Incarnation:i1 Since:2 Legacy:false After:0/100 InFlight:1}}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New(Settings{})
			open(t, r)
			step(t, r, Inspected{Record: rec, Slot: slotAt}, "Claim{}")
			step(t, r, Claimed{Head: StreamHead{Name: "S", Created: "t1", Replicas: 1}, Record: rec}, "LookAtStream{Anchors:[] Quiet:false}")
			step(t, r, tc.ev, tc.want)
		})
	}
	// Made again under a session that opened it holding messages, before
	// it stored any: refused.
	r := New(Settings{})
	open(t, r)
	step(t, r, Inspected{Record: rec, Slot: slotAt}, "Claim{}")
	step(t, r, Claimed{Head: StreamHead{Name: "S", Created: "t1", LastSeq: 9, Replicas: 1}, Record: rec}, "LookAtStream{Anchors:[] Quiet:false}")
	step(t, r, StreamLook{Created: "t2", Seen: Seen{Known: true}},
		"Refuse{Refusal:stream S was deleted and made again (the server created it at t2; this slot published to one created at t1): the batches it held are gone, acknowledged by JetStream whether or not a consumer had read them Say:true} Wait{Delay:5s Err:<nil> Say:false}")

	// The same session knowing the stream by the message it opened it at
	// (an earlier session's marker, written before that session recorded
	// anything): another replica reporting another creation time is the
	// same stream while it holds that message, and one that lacks it was
	// made again (make sim, seed 711077751: refused, the marker still
	// there).
	last := wire.Anchor{Seq: 9, Mark: "id:" + wire.MarkerID + "x-1/1"}
	replaced := "Refuse{Refusal:stream S was deleted and made again (the server created it at t2; this slot published to one created at t1): the batches it held are gone, acknowledged by JetStream whether or not a consumer had read them Say:true} Wait{Delay:5s Err:<nil> Say:false}"
	for _, tc := range []struct {
		name    string
		missing []wire.Anchor
		want    string
	}{
		{"another replica, the message there", nil, "Resume{Owner:{Origin:/0/ Incarnation:i1 Since:2 Legacy:false After:0/100 InFlight:1}}"},
		{"made again, the message gone", []wire.Anchor{last}, replaced},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New(Settings{})
			open(t, r)
			step(t, r, Inspected{Record: rec, Slot: slotAt}, "Claim{}")
			step(t, r, Claimed{Head: StreamHead{Name: "S", Created: "t1", LastSeq: 9, Last: last, Replicas: 1}, Record: rec},
				"LookAtStream{Anchors:[{Seq:9 Mark:id:marker-x-1/1}] Quiet:false}")
			step(t, r, StreamLook{Created: "t2", Seen: Seen{Known: true, First: 1, Last: 9}, Missing: tc.missing}, tc.want)
		})
	}
}

// The resume's findings: a stream of another owner or a trimmed window
// refuses, another failure is retried; a stream past this server's WAL
// makes the ids unique.
func TestResumed(t *testing.T) {
	foreign := &ForeignStreamError{Stream: "S", Reason: "from elsewhere", Stored: "a", Here: "b"}
	trimmed := &WindowTrimmedError{Stream: "S", Seq: 4, Limits: "max_msgs=10"}
	for _, tc := range []struct {
		name string
		ev   Resumed
		auto bool
		want string
	}{
		{"foreign", Resumed{Err: foreign}, true, "Refuse{Refusal:" + foreign.Error() + " Say:true} Wait{Delay:5s Err:<nil> Say:false}"},
		{"trimmed", Resumed{Err: trimmed}, false, "Refuse{Refusal:" + trimmed.Error() + " Say:true} Wait{Delay:5s Err:<nil> Say:false}"},
		{"trimmed, auto resync", Resumed{Err: trimmed}, true, "Resync{Refusal:" + trimmed.Error() + "}"},
		{"failed", Resumed{Err: errors.New("timeout")}, false, "Wait{Delay:250ms Err:timeout Say:true}"},
		{"past the WAL", Resumed{Reach: wal.Position{Commit: 0x300}, WAL: 0x200}, false, "UniqueIDs{} Publish{}"},
		{"at the WAL", Resumed{Reach: wal.Position{Commit: 0x200}, WAL: 0x200}, false, "Publish{}"},
		{"markers stored", Resumed{Anchors: Anchors{Last: wire.Anchor{Seq: 7, Mark: "m7"}}}, false, "RecordAnchor{Anchor:{Seq:7 Mark:m7} Seen:{Known:true First:0 Last:0 Deleted:0 Batches:0 Trims:false Keeps:0 Quiet:false} Stream:{Name: Created:}} Publish{}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New(Settings{AutoResync: tc.auto})
			open(t, r)
			step(t, r, Inspected{Record: boundAt, Slot: slotAt}, "Claim{}")
			step(t, r, Claimed{Head: headAt, Record: boundAt}, "LookAtStream{Anchors:[] Quiet:false}")
			step(t, r, StreamLook{Created: "t1", Seen: seen0},
				"RecordAnchor{Anchor:{Seq:0 Mark:} Seen:{Known:true First:0 Last:0 Deleted:0 Batches:0 Trims:false Keeps:0 Quiet:false} Stream:{Name: Created:}} Resume{Owner:{Origin:/0/ Incarnation:i1 Since:0 Legacy:false After:0/100 InFlight:1}}")
			step(t, r, tc.ev, tc.want)
		})
	}
}

// In flight: the setting, else one on a stream of one replica and two on
// a replicated one.
func TestInFlight(t *testing.T) {
	for _, tc := range []struct {
		cfg, replicas, want int
	}{{0, 1, 1}, {0, 3, 2}, {5, 3, 5}, {4, 1, 4}} {
		r := New(Settings{MaxInFlight: tc.cfg})
		r.stream.Replicas = tc.replicas
		if got := r.inFlight(); got != tc.want {
			t.Errorf("MaxInFlight %d, %d replicas: %d in flight, want %d", tc.cfg, tc.replicas, got, tc.want)
		}
	}
}

// While streaming, a look at what the session reads through and at the
// stream stops it when the tokens can no longer be read or the stream
// lost what was stored, and keeps the newest message found in the record.
func TestChecksWhileStreaming(t *testing.T) {
	stored := Anchors{Last: wire.Anchor{Seq: 4, Mark: "m4"}, Batch: wire.Anchor{Seq: 3, Mark: "id:3"}}
	for _, tc := range []struct {
		name string
		ev   LookTaken
		want string
	}{
		{"schema", LookTaken{Schema: errors.New("no column secret")}, "Stop{Refusal:no column secret}"},
		{"publication", LookTaken{Publication: errors.New("no tokens table")}, "Stop{Refusal:no tokens table}"},
		{"resync needed", LookTaken{ResyncNeeded: true}, "Stop{Refusal:resync_needed}"},
		{"nats", LookTaken{NATS: errors.New("store full")}, "Stop{Refusal:store full}"},
		{"refused by another", LookTaken{Refused: Refusal{Fact: StreamPurged, Err: &RecordedRefusal{Said: "purged"}}, NATS: errors.New("store full")}, "Stop{Refusal:purged}"},
		{"anchor gone", LookTaken{Stream: StreamLook{Created: "t1", Missing: []wire.Anchor{{Seq: 3, Mark: "id:3"}}}},
			"Stop{Refusal:stream S no longer holds message 3 that this tailer stored on it (id:3): it was deleted and made again, restored from an older backup, or purged (of the batches' subject alone too): the batches it held are gone, acknowledged by JetStream whether or not a consumer had read them}"},
		{"another replica", LookTaken{Stream: StreamLook{Created: "t9", Seen: Seen{Known: true, First: 1, Last: 4}}},
			"RecordAnchor{Anchor:{Seq:4 Mark:m4} Seen:{Known:true First:1 Last:4 Deleted:0 Batches:0 Trims:false Keeps:0 Quiet:false} Stream:{Name: Created:}}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New(Settings{})
			toStream(t, r, boundAt, headAt)
			step(t, r, LookDue{Anchors: stored}, "LookAtStream{Anchors:[{Seq:3 Mark:id:3} {Seq:4 Mark:m4}] Quiet:false}")
			step(t, r, tc.ev, tc.want)
		})
	}
	r := New(Settings{})
	toStream(t, r, boundAt, headAt)
	step(t, r, LookDue{Anchors: stored}, "LookAtStream{Anchors:[{Seq:3 Mark:id:3} {Seq:4 Mark:m4}] Quiet:false}")
	step(t, r, LookTaken{Stream: StreamLook{Created: "t1", Seen: Seen{Known: true, First: 1, Last: 4}}},
		"RecordAnchor{Anchor:{Seq:4 Mark:m4} Seen:{Known:true First:1 Last:4 Deleted:0 Batches:0 Trims:false Keeps:0 Quiet:false} Stream:{Name: Created:}}")
	// Known now: looked for beside what is stored next; recorded once.
	step(t, r, LookDue{Anchors: Anchors{Last: wire.Anchor{Seq: 6, Mark: "m6"}, Batch: wire.Anchor{Seq: 3, Mark: "id:3"}}}, "LookAtStream{Anchors:[{Seq:3 Mark:id:3} {Seq:4 Mark:m4} {Seq:6 Mark:m6}] Quiet:false}")
	step(t, r, LookTaken{Stream: StreamLook{Created: "t1", Seen: Seen{Known: true, First: 1, Last: 4}}}, "RecordAnchor{Anchor:{Seq:6 Mark:m6} Seen:{Known:true First:1 Last:4 Deleted:0 Batches:0 Trims:false Keeps:0 Quiet:false} Stream:{Name: Created:}}")
	step(t, r, LookDue{Anchors: stored}, "LookAtStream{Anchors:[{Seq:3 Mark:id:3} {Seq:6 Mark:m6} {Seq:4 Mark:m4}] Quiet:false}")
	// A message gone: a quiet look tells whether batches were, and with no
	// quiet look to count from (the first one was not), it was.
	step(t, r, LookTaken{Stream: StreamLook{Created: "t1", Seen: Seen{Known: true, First: 1, Last: 4, Deleted: 1}}},
		"LookAtStream{Anchors:[{Seq:3 Mark:id:3} {Seq:6 Mark:m6} {Seq:4 Mark:m4}] Quiet:true}")
	step(t, r, LookTaken{Stream: StreamLook{Created: "t1", Seen: Seen{Known: true, First: 1, Last: 4, Deleted: 1, Quiet: true}}},
		"Stop{Refusal:stream S no longer holds messages this slot published after sequence 0, and its configuration removes none: it was purged: the batches it held are gone, acknowledged by JetStream whether or not a consumer had read them}")
	step(t, r, NATSTrouble{Err: errors.New("denied")}, "Stop{Refusal:denied}")
	// Once the session ended, a late look is passed over.
	step(t, r, Ended{End: EndRefused, Refusal: Refusal{Fact: StreamPurged, Err: errors.New("purged")}}, "Refuse{Refusal:purged Say:true} Wait{Delay:5s Err:<nil> Say:false}")
	step(t, r, LookTaken{NATS: errors.New("late")}, "")
	step(t, r, NATSTrouble{Err: errors.New("late")}, "")
	step(t, r, LookDue{}, "")
}

// The next session of the same process knows the stream by what the last
// one stored, checked or not.
func TestNextSessionKnowsTheStream(t *testing.T) {
	r := New(Settings{})
	toStream(t, r, boundAt, headAt)
	step(t, r, LookDue{Anchors: Anchors{Last: wire.Anchor{Seq: 2, Mark: "m2"}, Batch: wire.Anchor{Seq: 1, Mark: "id:1"}}}, "LookAtStream{Anchors:[{Seq:1 Mark:id:1} {Seq:2 Mark:m2}] Quiet:false}")
	step(t, r, LookTaken{Stream: StreamLook{Created: "t1", Seen: Seen{Known: true, First: 1, Last: 2}}}, "RecordAnchor{Anchor:{Seq:2 Mark:m2} Seen:{Known:true First:1 Last:2 Deleted:0 Batches:0 Trims:false Keeps:0 Quiet:false} Stream:{Name: Created:}}")
	step(t, r, Ended{End: EndNATS, Err: errors.New("cut"), Anchors: Anchors{Last: wire.Anchor{Seq: 5, Mark: "m5"}, Batch: wire.Anchor{Seq: 5, Mark: "id:5"}}}, "Wait{Delay:250ms Err:cut Say:true}")
	open(t, r)
	step(t, r, Inspected{Record: boundAt, Slot: slotAt}, "Claim{}")
	step(t, r, Claimed{Head: StreamHead{Name: "S", Created: "t2", LastSeq: 5, Replicas: 1}, Record: boundAt}, "LookAtStream{Anchors:[{Seq:1 Mark:id:1} {Seq:2 Mark:m2} {Seq:5 Mark:id:5} {Seq:5 Mark:m5}] Quiet:false}")
}

// How a session ended: exit, stand by, refuse, or retry after a delay
// that doubles to its bound and starts afresh after a long session.
func TestSessionEnds(t *testing.T) {
	failed := errors.New("failed")
	r := New(Settings{})
	open(t, r)
	step(t, r, Ended{End: EndStartupConfig, Err: failed}, "Exit{Err:failed}")
	for _, kind := range []EndKind{EndStoppedUnpublished, EndConfig, EndStreamConfig} {
		step(t, New(Settings{}), Ended{End: kind, Err: failed}, "Exit{Err:failed}")
	}
	r = New(Settings{})
	var want []string
	for _, d := range []string{"250ms", "500ms", "1s", "2s", "4s", "8s", "16s", "30s", "30s"} {
		want = append(want, "Wait{Delay:"+d+" Err:failed Say:true}")
	}
	var got []string
	for range want {
		got = append(got, cmds(r.Step(Ended{End: EndPostgres, Err: failed})))
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("PostgreSQL failures wait\n%s\nwant\n%s", got, want)
	}
	step(t, r, Ended{End: EndPostgres, Err: failed, Lasted: time.Minute}, "Wait{Delay:30s Err:failed Say:true}")
	step(t, r, Ended{End: EndPostgres, Err: failed, Lasted: 2 * time.Minute}, "Wait{Delay:250ms Err:failed Say:true}")
	// After a refusal, a failure is retried after twice the refusal's
	// delay.
	step(t, r, Ended{End: EndFound, Found: SlotLost}, "Refuse{Refusal:slot_lost Say:true} Wait{Delay:5s Err:<nil> Say:false}")
	step(t, r, Ended{End: EndPostgres, Err: failed}, "Wait{Delay:10s Err:failed Say:true}")
	// After a session streamed, a startup setting is retried.
	r = New(Settings{})
	toStream(t, r, boundAt, headAt)
	step(t, r, Ended{End: EndStartupConfig, Err: failed}, "Wait{Delay:250ms Err:failed Say:true}")
	// NATS: at most 2 s apart, and another server after two in a row.
	r = New(Settings{})
	step(t, r, Ended{End: EndNATS, Err: failed}, "Wait{Delay:250ms Err:failed Say:true}")
	step(t, r, Ended{End: EndNATS, Err: failed}, "Reconnect{} Wait{Delay:500ms Err:failed Say:true}")
	step(t, r, Ended{End: EndNATS, Err: failed}, "Wait{Delay:1s Err:failed Say:true}")
	step(t, r, Ended{End: EndPostgres, Err: failed}, "Wait{Delay:2s Err:failed Say:true}")
	step(t, r, Ended{End: EndNATS, Err: failed}, "Wait{Delay:2s Err:failed Say:true}")
	step(t, r, Ended{End: EndNATS, Err: failed, Cause: errors.New("store full")}, "Refuse{Refusal:store full Say:true} Wait{Delay:5s Err:<nil> Say:false}")
	step(t, r, Ended{End: EndNATS, Err: failed, Cause: errors.New("store full")}, "Refuse{Refusal:store full Say:false} Wait{Delay:5s Err:<nil> Say:false}")
	// Another process holds the slot: said once, looked at every second.
	step(t, r, Ended{End: EndLeaseHeld, Err: failed}, "StandBy{Err:failed Say:true} Wait{Delay:1s Err:<nil> Say:false}")
	step(t, r, Ended{End: EndLeaseHeld, Err: failed}, "StandBy{Err:failed Say:false} Wait{Delay:1s Err:<nil> Say:false}")
	step(t, r, Ended{End: EndFound, Found: ResyncNeeded}, "Refuse{Refusal:resync_needed Say:true} Wait{Delay:5s Err:<nil> Say:false}")
	step(t, r, Ended{End: EndLeaseHeld, Err: failed}, "StandBy{Err:failed Say:true} Wait{Delay:1s Err:<nil> Say:false}")
}

// A PubAck of a reused id: the next sessions name their batches apart.
// One naming a message the stream no longer holds: the stream lost it.
func TestPubAckEnds(t *testing.T) {
	r := New(Settings{})
	toStream(t, r, boundAt, headAt)
	step(t, r, Ended{End: EndReusedID, Err: errors.New("reused")}, "Wait{Delay:250ms Err:reused Say:true}")
	open(t, r)
	step(t, r, Inspected{Record: boundAt, Slot: slotAt}, "Claim{}")
	step(t, r, Claimed{Head: headAt, Record: boundAt}, "LookAtStream{Anchors:[] Quiet:false}")
	step(t, r, StreamLook{Created: "t1", Seen: seen0}, "RecordAnchor{Anchor:{Seq:0 Mark:} Seen:{Known:true First:0 Last:0 Deleted:0 Batches:0 Trims:false Keeps:0 Quiet:false} Stream:{Name: Created:}} Resume{Owner:{Origin:/0/ Incarnation:i1 Since:0 Legacy:false After:0/100 InFlight:1}}")
	step(t, r, Resumed{}, "UniqueIDs{} Publish{}")
	step(t, r, Ended{End: EndBatchGone, Err: errors.New("gone")}, "Refuse{Refusal:gone Say:true} Wait{Delay:5s Err:<nil> Say:false}")
	if f := r.rec.Refused.Fact; f != NoFact {
		t.Fatalf("the relay wrote the record itself: %v", f)
	}
	limited := headAt
	limited.Seen.Trims = true
	r = New(Settings{AutoResync: true})
	toStream(t, r, boundAt, limited)
	step(t, r, Ended{End: EndBatchGone, Err: errors.New("gone")}, "Resync{Refusal:gone}")
	step(t, r, Resynced{Err: errors.New("no lease")}, "Wait{Delay:5s Err:no lease Say:true}")
	step(t, r, Resynced{}, "")
	r = New(Settings{})
	toStream(t, r, boundAt, headAt)
	step(t, r, Ended{End: EndBatchGone, Err: errors.New("gone")}, "Refuse{Refusal:gone Say:true} Wait{Delay:5s Err:<nil> Say:false}")
}

// A resync that worked starts the next session soon, and the next
// refusal is said again.
func TestResynced(t *testing.T) {
	r := New(Settings{AutoResync: true})
	open(t, r)
	step(t, r, Inspected{Record: SlotRecord{Exists: true, ResyncNeeded: true}, Slot: slotAt}, "Resync{Refusal:resync_needed}")
	step(t, r, Resynced{}, "Wait{Delay:250ms Err:<nil> Say:false}")
	step(t, r, Ended{End: EndPostgres, Err: errors.New("x")}, "Wait{Delay:500ms Err:x Say:true}")
	open(t, r)
	step(t, r, Inspected{Record: SlotRecord{Exists: true, ResyncPending: true}, Slot: slotAt}, "Resync{Refusal:resync_pending}")
	step(t, r, Resynced{Err: errors.New("no lease")}, "Wait{Delay:5s Err:no lease Say:true}")
	step(t, r, Ended{End: EndPostgres, Err: errors.New("x")}, "Wait{Delay:10s Err:x Say:true}")
}

// A process frozen after it read the record finds, once the slot streams
// to it, another incarnation there (its lease lapsed and a resync made
// the slot again): the session ends before it publishes anything.
func TestRecordMovedUnderAFrozenSession(t *testing.T) {
	r := New(Settings{})
	open(t, r)
	step(t, r, Inspected{Record: boundAt, Slot: slotAt}, "Claim{}")
	moved := boundAt
	moved.Incarnation = "i2"
	step(t, r, Claimed{Head: headAt, Record: moved}, "Wait{Delay:250ms Err:"+errRecordMoved.Error()+" Say:true}")
}

// One refused by another process meanwhile refuses it too.
func TestRefusedUnderAFrozenSession(t *testing.T) {
	r := New(Settings{})
	open(t, r)
	step(t, r, Inspected{Record: boundAt, Slot: slotAt}, "Claim{}")
	refused := boundAt
	refused.Refused = Refusal{Fact: StreamPurged, Err: &RecordedRefusal{Said: "purged"}}
	step(t, r, Claimed{Head: headAt, Record: refused}, "Refuse{Refusal:purged Say:true} Wait{Delay:5s Err:<nil> Say:false}")
}

// What a stream whose configuration removes nothing lost is told by its
// batches: with a quiet look to count from (the session's first, or the
// record's at a clean stop), messages gone are no loss while the stream
// holds every batch it held then and every one stored since (the session
// markers' subject purged), and a loss naming how many otherwise. A look
// while messages are on their way asks once for a quiet one; a limit
// taken off after it removed messages is no purge, across restarts.
func TestBatchesCounted(t *testing.T) {
	quietAt := func(r *Relay, rec SlotRecord, seen Seen) {
		t.Helper()
		open(t, r)
		step(t, r, Inspected{Record: rec, Slot: slotAt}, "Claim{}")
		step(t, r, Claimed{Head: headAt, Record: rec}, "LookAtStream{Anchors:[] Quiet:false}")
		seen.Quiet = true
		step(t, r, StreamLook{Created: "t1", Seen: seen},
			fmt.Sprintf("RecordAnchor{Anchor:{Seq:0 Mark:} Seen:%+v Stream:{Name: Created:}} Resume{Owner:{Origin:/0/ Incarnation:i1 Since:0 Legacy:false After:0/100 InFlight:1}}", seen.recordable()))
		step(t, r, Resumed{}, "Publish{}")
	}
	start := Seen{Known: true, First: 1, Last: 10, Batches: 6}
	markers := Seen{Known: true, First: 3, Last: 14, Deleted: 2, Batches: 10}
	r := New(Settings{})
	quietAt(r, boundAt, start)
	step(t, r, LookDue{}, "LookAtStream{Anchors:[] Quiet:false}")
	step(t, r, LookTaken{Stream: StreamLook{Created: "t1", Seen: markers, Stored: 3}}, "LookAtStream{Anchors:[] Quiet:true}")
	// Something on its way all the same: the next check looks again.
	step(t, r, LookTaken{Stream: StreamLook{Created: "t1", Seen: markers, Stored: 3}}, "")
	step(t, r, LookDue{}, "LookAtStream{Anchors:[] Quiet:false}")
	step(t, r, LookTaken{Stream: StreamLook{Created: "t1", Seen: markers, Stored: 3}}, "LookAtStream{Anchors:[] Quiet:true}")
	quiet := markers
	quiet.Quiet = true
	step(t, r, LookTaken{Stream: StreamLook{Created: "t1", Seen: quiet, Stored: 4}}, "")
	// A batch gone: counted from the last quiet look.
	gone := Seen{Known: true, First: 3, Last: 16, Deleted: 3, Batches: 11, Quiet: true}
	step(t, r, LookDue{}, "LookAtStream{Anchors:[] Quiet:false}")
	step(t, r, LookTaken{Stream: StreamLook{Created: "t1", Seen: gone, Stored: 6}},
		"Stop{Refusal:stream S no longer holds messages this slot published after sequence 0, and its configuration removes none: it was purged (1 batch messages gone): the batches it held are gone, acknowledged by JetStream whether or not a consumer had read them}")

	// The record's look at a clean stop counts for the next session: the
	// markers purged while no tailer ran lost no batch; one more gone did.
	stopped := boundAt
	stopped.Seen = Seen{Known: true, First: 1, Last: 10, Batches: 6, Quiet: true}
	r = New(Settings{})
	open(t, r)
	step(t, r, Inspected{Record: stopped, Slot: slotAt}, "Claim{}")
	step(t, r, Claimed{Head: headAt, Record: stopped}, "LookAtStream{Anchors:[] Quiet:false}")
	step(t, r, StreamLook{Created: "t1", Seen: Seen{Known: true, First: 4, Last: 10, Deleted: 1, Batches: 6, Quiet: true}},
		"RecordAnchor{Anchor:{Seq:0 Mark:} Seen:{Known:true First:4 Last:10 Deleted:1 Batches:6 Trims:false Keeps:0 Quiet:false} Stream:{Name: Created:}} Resume{Owner:{Origin:/0/ Incarnation:i1 Since:0 Legacy:false After:0/100 InFlight:1}}")
	r = New(Settings{})
	open(t, r)
	step(t, r, Inspected{Record: stopped, Slot: slotAt}, "Claim{}")
	step(t, r, Claimed{Head: headAt, Record: stopped}, "LookAtStream{Anchors:[] Quiet:false}")
	step(t, r, StreamLook{Created: "t1", Seen: Seen{Known: true, First: 4, Last: 10, Deleted: 1, Batches: 5, Quiet: true}},
		"Refuse{Refusal:stream S no longer holds messages this slot published after sequence 0, and its configuration removes none: it was purged (1 batch messages gone): "+
			"the batches it held are gone, acknowledged by JetStream whether or not a consumer had read them Say:true} Wait{Delay:5s Err:<nil> Say:false}")
	// Recorded by a session that went on publishing (killed since): what
	// it stored after is not known, and a message gone is a purge.
	killed := stopped
	killed.Seen.Quiet = false
	r = New(Settings{})
	open(t, r)
	step(t, r, Inspected{Record: killed, Slot: slotAt}, "Claim{}")
	step(t, r, Claimed{Head: headAt, Record: killed}, "LookAtStream{Anchors:[] Quiet:false}")
	step(t, r, StreamLook{Created: "t1", Seen: Seen{Known: true, First: 4, Last: 10, Deleted: 1, Batches: 6, Quiet: true}},
		"Refuse{Refusal:stream S no longer holds messages this slot published after sequence 0, and its configuration removes none: it was purged: "+
			"the batches it held are gone, acknowledged by JetStream whether or not a consumer had read them Say:true} Wait{Delay:5s Err:<nil> Say:false}")

	// A limit seen trimming, then taken off: its first sequence past the
	// incarnation's is no purge, now or after a restart.
	trimmed := boundAt
	trimmed.StreamSeq, trimmed.Seen = 2, Seen{Known: true, First: 40, Last: 52, Trims: true}
	r = New(Settings{})
	open(t, r)
	step(t, r, Inspected{Record: trimmed, Slot: slotAt}, "Claim{}")
	step(t, r, Claimed{Head: headAt, Record: trimmed}, "LookAtStream{Anchors:[] Quiet:false}")
	off := Seen{Known: true, First: 41, Last: 60, Quiet: true}
	step(t, r, StreamLook{Created: "t1", Seen: off},
		"RecordAnchor{Anchor:{Seq:0 Mark:} Seen:{Known:true First:41 Last:60 Deleted:0 Batches:0 Trims:false Keeps:0 Quiet:false} Stream:{Name: Created:}} Resume{Owner:{Origin:/0/ Incarnation:i1 Since:2 Legacy:false After:0/100 InFlight:1}}")
	after := boundAt
	after.StreamSeq, after.Seen = 2, off.recordable()
	r = New(Settings{})
	open(t, r)
	step(t, r, Inspected{Record: after, Slot: slotAt}, "Claim{}")
	step(t, r, Claimed{Head: headAt, Record: after}, "LookAtStream{Anchors:[] Quiet:false}")
	step(t, r, StreamLook{Created: "t1", Seen: Seen{Known: true, First: 41, Last: 62, Quiet: true}},
		"RecordAnchor{Anchor:{Seq:0 Mark:} Seen:{Known:true First:41 Last:62 Deleted:0 Batches:0 Trims:false Keeps:0 Quiet:false} Stream:{Name: Created:}} Resume{Owner:{Origin:/0/ Incarnation:i1 Since:2 Legacy:false After:0/100 InFlight:1}}")
}

// An anchor gone is a loss unless it is a session marker (by its mark):
// then only the batches' count can tell; one below the first sequence of
// a stream that trims went by its limits.
func TestAnchorsGone(t *testing.T) {
	r := New(Settings{})
	marker := wire.Anchor{Seq: 9, Mark: "id:" + wire.MarkerID + "ab-1/1"}
	if !marker.IsMarker() || (wire.Anchor{Seq: 9, Mark: "id:0/16:0-0/16:2"}).IsMarker() {
		t.Fatal("IsMarker")
	}
	batch, other := r.gone(StreamLook{Missing: []wire.Anchor{marker}}, false)
	if batch.Seq != 0 || other != marker {
		t.Errorf("a marker gone: batch %v, marker %v", batch, other)
	}
	b := wire.Anchor{Seq: 5, Mark: "id:x"}
	if batch, _ := r.gone(StreamLook{Missing: []wire.Anchor{marker, b}}, false); batch != b {
		t.Errorf("a batch gone beside a marker: %v", batch)
	}
	if batch, other := r.gone(StreamLook{Seen: Seen{First: 8}, Missing: []wire.Anchor{b}}, true); batch.Seq != 0 || other.Seq != 0 {
		t.Errorf("an anchor below the first sequence of a stream that trims: %v %v", batch, other)
	}
}

// A limit of messages bounds what it could have removed: a stream seen
// keeping at most 12, then without the limit, that lost more than the
// limit could have taken was purged; one that lost what it could have
// taken was trimmed. A limit of bytes bounds nothing.
func TestBeyondLimits(t *testing.T) {
	for _, tc := range []struct {
		name        string
		before, now Seen
		want        bool
	}{
		{"purged below the limit", Seen{Known: true, Trims: true, Keeps: 12}, Seen{Known: true, First: 4, Last: 3}, true},
		{"trimmed to the limit", Seen{Known: true, First: 1, Last: 12, Trims: true, Keeps: 12}, Seen{Known: true, First: 6, Last: 17}, false},
		{"more than the limit took", Seen{Known: true, First: 1, Last: 12, Trims: true, Keeps: 12}, Seen{Known: true, First: 8, Last: 17}, true},
		{"a lower limit now", Seen{Known: true, First: 1, Last: 12, Trims: true, Keeps: 12}, Seen{Known: true, First: 10, Last: 14, Trims: true, Keeps: 5}, false},
		{"a limit of bytes", Seen{Known: true, First: 1, Last: 12, Trims: true}, Seen{Known: true, First: 12, Last: 14}, false},
		{"a limit set since", Seen{Known: true, First: 1, Last: 12}, Seen{Known: true, First: 10, Last: 14, Trims: true, Keeps: 5}, false},
		{"a limit set since, and more gone", Seen{Known: true, First: 1, Last: 12}, Seen{Known: true, First: 13, Last: 14, Trims: true, Keeps: 5}, true},
		{"a stream shorter than before", Seen{Known: true, First: 1, Last: 12, Trims: true, Keeps: 5}, Seen{Known: true, First: 1, Last: 3, Trims: true, Keeps: 5}, false},
		{"a message gone within, the limit taken off since", Seen{Known: true, First: 1, Last: 1, Trims: true, Keeps: 12}, Seen{Known: true, First: 1, Last: 13, Deleted: 1}, true},
		{"a message gone within under a limit of bytes", Seen{Known: true, First: 1, Last: 1, Trims: true}, Seen{Known: true, First: 1, Last: 13, Deleted: 1}, false},
		{"a message gone within, nothing stored since", Seen{Known: true, First: 1, Last: 12, Trims: true, Keeps: 12}, Seen{Known: true, First: 1, Last: 12, Deleted: 1, Trims: true, Keeps: 12}, true},
	} {
		if got := beyondLimits(tc.before, tc.now); got != tc.want {
			t.Errorf("%s: beyondLimits = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A stream whose configuration removes nothing was purged when its first
// sequence moved on, or more messages within it are gone; before a
// judged look, when its first message is past the incarnation's first.
func TestPurgedSeen(t *testing.T) {
	for _, tc := range []struct {
		name        string
		now, before Seen
		since       uint64
		judged      bool
		want        bool
	}{
		{"nothing moved", Seen{Known: true, First: 1, Last: 9}, Seen{Known: true, First: 1, Last: 5}, 0, true, false},
		{"the first sequence moved on", Seen{Known: true, First: 3, Last: 9}, Seen{Known: true, First: 1, Last: 5}, 0, true, true},
		{"a message deleted within", Seen{Known: true, First: 1, Last: 9, Deleted: 1}, Seen{Known: true, First: 1, Last: 5}, 0, true, true},
		{"empty before, held since from the next", Seen{Known: true, First: 1, Last: 9}, Seen{Known: true}, 0, true, false},
		{"empty before, the first stored since gone", Seen{Known: true, First: 6, Last: 9}, Seen{Known: true}, 0, true, true},
		{"emptied before, held since from the next", Seen{Known: true, First: 6, Last: 9}, Seen{Known: true, First: 6, Last: 5}, 0, true, false},
		{"emptied before, the first stored since gone", Seen{Known: true, First: 7, Last: 9}, Seen{Known: true, First: 6, Last: 5}, 0, true, true},
		{"nothing known before", Seen{Known: true, First: 6, Last: 9}, Seen{}, 0, true, false},
		{"not judged yet, past the incarnation's first", Seen{Known: true, First: 7, Last: 9}, Seen{}, 5, false, true},
		{"not judged yet, at the incarnation's first", Seen{Known: true, First: 6, Last: 9}, Seen{}, 5, false, false},
		{"judged, past the incarnation's first", Seen{Known: true, First: 7, Last: 9}, Seen{Known: true, First: 7, Last: 8}, 5, true, false},
	} {
		if got := Purged(tc.now, tc.before, tc.since, tc.judged); got != tc.want {
			t.Errorf("%s: Purged = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A stream whose last sequence is below a message the tailer stored there
// was made again or restored from an older backup: no purge, limit or
// delete lowers it. Refused though it holds as many batches as the record
// counted (other ones: make sim seed 1621335431) and the message gone is
// a session marker, which alone would say nothing; a marker gone from a
// stream whose last sequence is at it or past it (its subject purged) is
// no loss.
func TestStreamGoneBack(t *testing.T) {
	marker := wire.Anchor{Seq: 6, Mark: "id:" + wire.MarkerID + "ab-1/1"}
	rec := boundAt
	rec.StreamSeq, rec.Anchor = 6, marker
	rec.Seen = Seen{Known: true, First: 3, Last: 6, Batches: 1, Quiet: true}
	check := func(seen Seen, want string) {
		t.Helper()
		r := New(Settings{})
		open(t, r)
		step(t, r, Inspected{Record: rec, Slot: slotAt}, "Claim{}")
		step(t, r, Claimed{Head: headAt, Record: rec}, fmt.Sprintf("LookAtStream{Anchors:[%+v] Quiet:false}", marker))
		step(t, r, StreamLook{Created: "t1", Seen: seen, Missing: []wire.Anchor{marker}}, want)
	}
	check(Seen{Known: true, First: 1, Last: 2, Batches: 1, Quiet: true},
		"Refuse{Refusal:stream S no longer holds message 6 that this tailer stored on it (id:marker-ab-1/1): it was deleted and made again, restored from an older backup, or purged (of the batches' subject alone too): "+
			"the batches it held are gone, acknowledged by JetStream whether or not a consumer had read them Say:true} Wait{Delay:5s Err:<nil> Say:false}")
	check(Seen{Known: true, First: 3, Last: 6, Deleted: 1, Batches: 1, Quiet: true},
		"RecordAnchor{Anchor:{Seq:0 Mark:} Seen:{Known:true First:3 Last:6 Deleted:1 Batches:1 Trims:false Keeps:0 Quiet:false} Stream:{Name: Created:}} Resume{Owner:{Origin:/0/ Incarnation:i1 Since:6 Legacy:false After:0/100 InFlight:1}}")
	check(Seen{Known: true, First: 3, Last: 8, Deleted: 1, Batches: 1, Quiet: true},
		"RecordAnchor{Anchor:{Seq:0 Mark:} Seen:{Known:true First:3 Last:8 Deleted:1 Batches:1 Trims:false Keeps:0 Quiet:false} Stream:{Name: Created:}} Resume{Owner:{Origin:/0/ Incarnation:i1 Since:6 Legacy:false After:0/100 InFlight:1}}")
}
