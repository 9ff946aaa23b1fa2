package relay

import (
	"errors"
	"fmt"
	"github.com/mailroom/tailer/decoder/wal"
	"strings"
	"testing"
)

// A batch's origin continues this server's WAL on the same system and
// database, on its timeline or an earlier one of its history the batch's
// position does not pass the end of.
func TestOriginContinues(t *testing.T) {
	o := Origin{SystemID: "7", Timeline: 3, Database: "mailroom", History: map[int32]wal.LSN{1: 0x100, 2: 0x200}}
	for _, tc := range []struct {
		stored   string
		pos      wal.LSN
		ok, past bool
	}{
		{"7/3/mailroom", 0x900, true, false},
		{"7/2/mailroom", 0x200, true, false},
		{"7/2/mailroom", 0x201, false, true},
		{"7/1/mailroom", 0x100, true, false},
		{"7/1/mailroom", 0x180, false, true},
		{"7/4/mailroom", 0x10, false, false},
		{"7/0/mailroom", 0x10, false, false},
		{"8/2/mailroom", 0x10, false, false},
		{"7/2/other", 0x10, false, false},
		{"7/x/mailroom", 0x10, false, false},
		{"7/2", 0x10, false, false},
	} {
		ok, past := o.Continues(tc.stored, tc.pos)
		if ok != tc.ok || past != tc.past {
			t.Errorf("Continues(%q, %s) = %v, %v; want %v, %v", tc.stored, tc.pos, ok, past, tc.ok, tc.past)
		}
	}
}

// A message is refused when published from another database, or past
// where this server's timeline branched; after the owner's start, when
// of another incarnation (or of none, unless the owner is legacy).
func TestCheckOwner(t *testing.T) {
	o := Owner{Origin: Origin{SystemID: "7", Timeline: 2, Database: "mailroom", History: map[int32]wal.LSN{1: 0x100}}, Incarnation: "i1", Since: 10}
	for _, tc := range []struct {
		name   string
		m      Published
		legacy bool
		want   string
	}{
		{"before the owner", Published{Seq: 10, Origin: "9/1/x", Incarnation: "other"}, false, ""},
		{"its own", Published{Seq: 11, Origin: "7/2/mailroom", Incarnation: "i1"}, false, ""},
		{"no origin", Published{Seq: 11, Incarnation: "i1"}, false, ""},
		{"another database", Published{Seq: 11, Origin: "9/2/mailroom", Incarnation: "i1"}, false, "published from another database (stream: origin 9/2/mailroom at seq 11; this server: origin 7/2/mailroom)"},
		{"past the branch", Published{Seq: 12, Origin: "7/1/mailroom", Incarnation: "i1", Last: wal.Position{Commit: 0x180}}, false, "published past the point where this server's timeline branched"},
		{"another incarnation", Published{Seq: 11, Origin: "7/2/mailroom", Incarnation: "i0"}, false, "another incarnation of the slot (a copy or restore of the database, or the slot made again since) (stream: incarnation i0 at seq 11; this server: incarnation i1, stream taken over after seq 10)"},
		{"none", Published{Seq: 11, Origin: "7/2/mailroom"}, false, "no incarnation"},
		{"none, legacy", Published{Seq: 11, Origin: "7/2/mailroom"}, true, ""},
		{"another, legacy", Published{Seq: 11, Origin: "7/2/mailroom", Incarnation: "i0"}, true, "another incarnation"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := o
			o.Legacy = tc.legacy
			err := CheckOwner("S", tc.m, o)
			var foreign *ForeignStreamError
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want == "":
			case !errors.As(err, &foreign) || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "stream S holds batches "):
				t.Fatalf("got %v, want a *ForeignStreamError saying %q", err, tc.want)
			}
		})
	}
}

// A session starts with as many markers as the most messages any session
// before may have left on their way.
func TestFence(t *testing.T) {
	for _, tc := range []struct {
		name  string
		o     Owner
		w     Window
		prev  *Published
		last  uint64
		k     int
		floor uint64
	}{
		{"empty stream", Owner{InFlight: 1}, Window{}, nil, 0, 1, 1},
		{"no in-flight given", Owner{}, Window{}, nil, 0, 1, 1},
		{"written without markers", Owner{InFlight: 1}, Window{}, nil, 7, legacyInFlight, 8},
		{"a wider session before", Owner{InFlight: 1}, Window{Floor: 3}, &Published{FenceN: 2, FenceK: 2, InFlight: 4}, 7, 4, 3},
		{"a narrower session before", Owner{InFlight: 3}, Window{}, &Published{FenceN: 1, FenceK: 1, InFlight: 1}, 7, 3, 8},
		{"markers not all landed", Owner{InFlight: 1}, Window{}, &Published{FenceN: 1, FenceK: 5, InFlight: 2}, 7, 5, 8},
		{"markers not all landed, wide", Owner{InFlight: 1}, Window{}, &Published{FenceN: 1, FenceK: 2, InFlight: 6}, 7, 6, 8},
	} {
		k, floor := Fence(tc.o, &tc.w, tc.prev, tc.last)
		if k != tc.k || floor != tc.floor {
			t.Errorf("%s: Fence = %d, %d; want %d, %d", tc.name, k, floor, tc.k, tc.floor)
		}
	}
}

// Each fact has a name the record keeps and reads back, and a reason
// tailer_blocked has a series for (the slot's loss its own metric); the
// stream's losses last, and a resync is no way out of a loss a consumer
// may have read around, but of a trimmed window.
func TestFacts(t *testing.T) {
	for f := NoFact + 1; f < numFacts; f++ {
		if ParseFact(f.String()) != f {
			t.Errorf("fact %d: %q reads back as %v", f, f.String(), ParseFact(f.String()))
		}
		if r := f.Reason(); r != ReasonSlotLost && !strings.Contains(strings.Join(Reasons, " "), r) || r == "" {
			t.Errorf("fact %v: reason %q", f, r)
		}
	}
	if ParseFact("") != NoFact || ParseFact("nonsense") != NoFact || NoFact.Reason() != "" || Fact(99).String() != "fact(99)" || numFacts.String() != fmt.Sprintf("fact(%d)", numFacts) {
		t.Error("no fact")
	}
	lasting := map[Fact]bool{StreamReplaced: true, StreamPurged: true, StreamLostAnchor: true, WindowTrimmed: true, SlotAdvanced: true}
	wayOut := map[Fact]bool{PublicationStale: true, ResyncNeeded: true, ResyncPending: true, SlotLost: true, SlotDropped: true, SlotUnrecorded: true, EarlierBatches: true, WindowTrimmed: true}
	marks := map[Fact]bool{PublicationProblem: true, RelationIncomplete: true}
	for f := NoFact; f < numFacts; f++ {
		if f.Lasting() != lasting[f] || f.ResyncWayOut() != wayOut[f] || f.MarksResyncNeeded() != marks[f] {
			t.Errorf("fact %v: lasting %v, resync its way out %v, marks resync needed %v", f, f.Lasting(), f.ResyncWayOut(), f.MarksResyncNeeded())
		}
	}
	reasons := map[Fact]string{SchemaUnreadable: ReasonSchema, UnknownAction: ReasonSchema, PublicationProblem: ReasonPublication, PublicationStale: ReasonPublication,
		RelationIncomplete: ReasonPublication, ResyncNeeded: ReasonResync, ResyncPending: ReasonResync, SlotDropped: ReasonResync, SlotUnrecorded: ReasonResync,
		EarlierBatches: ReasonResync, ForeignStream: ReasonStream, StreamReplaced: ReasonStream, StreamPurged: ReasonStream, StreamLostAnchor: ReasonStream,
		WindowTrimmed: ReasonStream, NATSStoresNothing: ReasonNATS, SlotLost: ReasonSlotLost, SlotAdvanced: ReasonResync, SlotShared: ReasonSchema, HealAsked: ReasonResync}
	for f, want := range reasons {
		if f.Reason() != want {
			t.Errorf("fact %v: reason %q, want %q", f, f.Reason(), want)
		}
	}
	if got := (Refusal{Fact: SlotLost}).Error(); got != "slot_lost" {
		t.Errorf("a refusal without words says %q", got)
	}
	if got := (Refusal{Fact: SlotLost, Err: &RecordedRefusal{Said: "said"}}).Error(); got != "said" {
		t.Errorf("a recorded refusal says %q", got)
	}
}

// Positions order by commit, then index; LSNs print as PostgreSQL does.
func TestPositions(t *testing.T) {
	a, b, c := wal.Position{Commit: 0x10, Index: 5}, wal.Position{Commit: 0x10, Index: 6}, wal.Position{Commit: 0x11}
	if a.Compare(b) != -1 || b.Compare(a) != 1 || a.Compare(a) != 0 || b.Compare(c) != -1 || c.Compare(b) != 1 || !a.Less(c) || c.Less(a) {
		t.Error("positions out of order")
	}
	if got := (wal.Position{Commit: 0x1_0000_00AB, Index: 3}).String(); got != "1/AB:3" {
		t.Errorf("position prints %q", got)
	}
}
