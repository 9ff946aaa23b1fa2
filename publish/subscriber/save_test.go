package subscriber

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/publish/subscriber/protocol"
)

// A save the server has no room for is kept in Stats and said once, until
// a save lands; another failure is no want of room.
func TestNoRoomIsKeptAndSaidOnce(t *testing.T) {
	var logged bytes.Buffer
	s := kept(t, &Subscriber{cfg: Config{Durable: "d", Log: slog.New(slog.NewTextHandler(&logged, nil))}}, protocol.Machine{})
	full := errors.New("nats: insufficient resources")
	s.noRoom(full)
	if n := strings.Count(logged.String(), "level=ERROR"); n != 1 {
		t.Fatalf("the first save with no room said %d times", n)
	}
	s.noRoom(full)
	if st := s.Stats(); !strings.Contains(st.NoRoom, "no room") || strings.Count(logged.String(), "level=ERROR") != 1 {
		t.Fatalf("after two saves with no room: NoRoom %q, log:\n%s", st.NoRoom, logged.String())
	}
	s.noRoom(nil)
	if st := s.Stats(); st.NoRoom != "" {
		t.Fatalf("after a save landed: NoRoom %q", st.NoRoom)
	}
	s.noRoom(nats.ErrTimeout)
	if st := s.Stats(); st.NoRoom != "" || strings.Count(logged.String(), "level=ERROR") != 1 {
		t.Fatalf("after a save unanswered: NoRoom %q, log:\n%s", st.NoRoom, logged.String())
	}
}

// The saver is told there is something to save only when there is a
// store, and at most once ahead.
func TestSignal(t *testing.T) {
	s := &Subscriber{kick: make(chan struct{}, 1)}
	s.signal()
	if len(s.kick) != 0 {
		t.Fatal("signalled with no store")
	}
	s.cfg.Progress = &slowBucket{}
	s.signal()
	s.signal()
	if len(s.kick) != 1 {
		t.Fatalf("%d signals waiting, want 1", len(s.kick))
	}
}
