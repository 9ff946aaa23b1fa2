package daemon

import (
	"errors"
	"strings"
	"testing"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/replication"
)

// The replication package says what happened; the way out, in the
// commands' words, is added here.
func TestAdvice(t *testing.T) {
	slot := replication.SlotInfo{Name: "mailroom", WALStatus: "lost", InvalidationReason: "wal_removed"}
	stale := &replication.PublicationError{Publication: "mailroom", Stale: true}
	missing := &replication.PublicationError{Publication: "mailroom", Problem: "does not exist"}
	_, ferr := replication.WantFailover(replication.FailoverOn, 16)
	var cerr *config.Error
	if !errors.As(FailoverSettingError(ferr), &cerr) || cerr.Var != "MAILROOM_SLOT_FAILOVER" {
		t.Fatalf("FailoverSettingError = %v, want a config.Error of MAILROOM_SLOT_FAILOVER", FailoverSettingError(ferr))
	}
	for _, tc := range []struct {
		fact, advised string
		want          []string
	}{
		{slot.LostReason(), LostSlotMessage(slot), []string{"tailer resync", "MAILROOM_AUTO_RESYNC"}},
		{stale.Error(), PublicationMessage(stale), []string{"tailer resync", "MAILROOM_AUTO_RESYNC"}},
		{missing.Error(), PublicationMessage(missing), []string{"tailer migrate", "ALTER PUBLICATION mailroom", "tailer resync"}},
		{ferr.Error(), FailoverSettingError(ferr).Error(), []string{"tailer resync", "auto or false"}},
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
