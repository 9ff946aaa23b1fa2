package embedded

import "testing"

// An acknowledged batch must be on disk: the tailer confirms the slot past
// it, so after a host crash nothing else holds it.
func TestSyncsBeforeAck(t *testing.T) {
	s, err := Start(t.TempDir(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	if cfg := s.JetStreamConfig(); cfg == nil || !cfg.SyncAlways {
		t.Fatalf("JetStream config %+v: want sync_always", cfg)
	}
}
