package daemon

import (
	"errors"
	"fmt"
	"github.com/mailroom/tailer/publish/wire"
	"strings"
	"testing"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/publish"
	"github.com/mailroom/tailer/publish/relay"
	"github.com/mailroom/tailer/replication"
)

// Every refusal the operator resolves: the lower packages say what
// happened; the way out, in the commands' words, is added here, and only
// here.
func TestAdvice(t *testing.T) {
	slot := replication.SlotInfo{Name: "mailroom", WALStatus: "lost", InvalidationReason: "wal_removed"}
	stale := &replication.PublicationError{Publication: "mailroom", Stale: true}
	missing := &replication.PublicationError{Publication: "mailroom", Problem: "does not exist"}
	_, ferr := replication.WantFailover(replication.FailoverOn, 16)
	foreignSlot := &replication.ForeignSlotError{Slot: "mailroom", Database: "other", Here: "app"}
	subject := &publish.StreamConfigError{Stream: "MAILROOM", Err: &publish.SubjectError{Subject: "mailroom.batches", Configured: "mailroom.batches", Subjects: []string{"x.>"}}}
	markers := &publish.StreamConfigError{Stream: "MAILROOM", Err: &publish.SubjectError{Subject: "mailroom.batches._session", Configured: "mailroom.batches", Subjects: []string{"mailroom.batches"}, Marker: true}}
	foreignStream := &relay.ForeignStreamError{Stream: "MAILROOM", Reason: "published from another database", Stored: "origin a", Here: "origin b"}
	relation := &decoder.RelationError{Relation: "public.tokens", Missing: []string{"secret"}}
	if !errors.As(Advise(foreignSlot), &foreignSlot) || Advise(errors.New("other")).Error() != "other" {
		t.Fatal("Advise hides the fact, or advises what it does not know")
	}
	var cerr *config.Error
	if !errors.As(FailoverSettingError(ferr), &cerr) || cerr.Var != "MAILROOM_SLOT_FAILOVER" {
		t.Fatalf("FailoverSettingError = %v, want a config.Error of MAILROOM_SLOT_FAILOVER", FailoverSettingError(ferr))
	}
	// As tailer resync meets it, wrapped: the same setting's error.
	if !errors.As(Advise(fmt.Errorf("slot failover: %w", ferr)), &cerr) || cerr.Var != "MAILROOM_SLOT_FAILOVER" {
		t.Fatalf("Advise(a failover refusal) = %v, want a config.Error of MAILROOM_SLOT_FAILOVER", Advise(ferr))
	}
	for _, tc := range []struct {
		fact, advised string
		want          []string
	}{
		{slot.LostReason(), LostSlotMessage(slot), []string{"tailer resync", "MAILROOM_AUTO_RESYNC"}},
		{stale.Error(), PublicationMessage(stale), []string{"tailer resync", "MAILROOM_AUTO_RESYNC"}},
		{missing.Error(), PublicationMessage(missing), []string{"tailer migrate", "ALTER PUBLICATION mailroom", "tailer resync"}},
		{ferr.Error(), FailoverSettingError(ferr).Error(), []string{"tailer resync", "auto or false"}},
		{foreignSlot.Error(), Advise(foreignSlot).Error(), []string{"MAILROOM_SLOT"}},
		{subject.Error(), Advise(subject).Error(), []string{"MAILROOM_NATS_SUBJECT"}},
		{markers.Error(), Advise(markers).Error(), []string{"mailroom.batches.>"}},
		{foreignStream.Error(), ForeignStreamMessage(foreignStream), []string{"tailer resync", "MAILROOM_NATS_STREAM"}},
		{relation.Error(), RelationMessage(relation, "mailroom"), []string{"ALTER PUBLICATION mailroom SET TABLE public.tokens", "tailer resync"}},
		{"stream MAILROOM was deleted and made again", StreamLossMessage(&relay.StreamLoss{Fact: relay.StreamReplaced, Stream: "MAILROOM", Created: "t2", Recorded: "t1"}), []string{"tailer resync"}},
		{`a token's action "magic_link" is no token action this tailer knows`, ActionMessage(&decoder.ActionError{Label: "magic_link"}), []string{"run a tailer that knows the action"}},
		{"stream MAILROOM's limits (max_msgs=5) removed message 7", WindowTrimmedMessage(&relay.WindowTrimmedError{Stream: "MAILROOM", Seq: 7, Limits: "max_msgs=5"}), []string{"tailer resync", "Raise the stream's limits"}},
		{"stream MAILROOM no longer holds message 7 that this tailer stored on it", StreamLossMessage(&relay.StreamLoss{Fact: relay.StreamLostAnchor, Stream: "MAILROOM", Anchor: wire.Anchor{Seq: 7, Mark: "id:a"}}), []string{"tailer resync"}},
		{"stream MAILROOM no longer holds messages this slot published after sequence 7", StreamLossMessage(&relay.StreamLoss{Fact: relay.StreamPurged, Stream: "MAILROOM", Since: 7}), []string{"tailer resync"}},
		{"publication mailroom could not carry token inserts", ResyncNeededMessage("mailroom", "mailroom", ""), []string{"tailer resync", "MAILROOM_AUTO_RESYNC"}},
		{"slot mailroom does not exist, but this database recorded it", DroppedSlotMessage("mailroom", "made by tailer run"), []string{"tailer resync", "MAILROOM_AUTO_RESYNC", "MAILROOM_NATS_STREAM"}},
		{"slot mailroom does not exist, but stream MAILROOM holds batches", UnrecordedSlotMessage("mailroom", "MAILROOM", 9), []string{"tailer resync", "MAILROOM_NATS_STREAM"}},
		{"a resync of slot mailroom was started and did not finish", PendingResyncMessage("mailroom"), []string{"tailer resync", "tailer migrate"}},
		{"stream MAILROOM holds batches (last seq 9) that slot mailroom did not publish", EarlierBatchesMessage("MAILROOM", 9, "mailroom", "made by hand"), []string{"tailer resync", "MAILROOM_NATS_STREAM"}},
	} {
		if !strings.Contains(tc.advised, tc.fact) {
			t.Errorf("%q does not say the fact %q", tc.advised, tc.fact)
		}
		for _, w := range tc.want {
			if !strings.Contains(tc.advised, w) {
				t.Errorf("%q does not name %s", tc.advised, w)
			}
			if strings.Contains(tc.fact, w) {
				t.Errorf("replication's %q names %s: the way out is the command layer's", tc.fact, w)
			}
		}
	}
}
