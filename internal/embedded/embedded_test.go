package embedded

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// helperEnv makes the test binary the helper process of TestSyncsBeforeAck.
const helperEnv = "TAILER_EMBEDDED_SYNC_HELPER"

// An acknowledged batch must be on disk: the tailer confirms the slot past
// it, so after a host crash nothing else holds it. A child process runs the
// server under strace and publishes messages one at a time, writing a
// line to stderr once each PubAck is in: every ack must come after an
// fsync of the store that followed the previous ack. With a sync interval
// (the server's own default, SyncInterval) the same run shows acks without
// one, so the check tells the two apart.
func TestSyncsBeforeAck(t *testing.T) {
	strace, err := exec.LookPath("strace")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("strace is missing: .ci/run installs it from Debian's packages")
		}
		t.Skip("strace not installed (apt-get install strace); CI runs this check")
	}
	for _, tc := range []struct {
		interval   string
		wantSynced bool
	}{{"", true}, {"1m", false}} {
		t.Run("interval="+tc.interval, func(t *testing.T) {
			dir := t.TempDir()
			trace := filepath.Join(dir, "trace")
			cmd := exec.Command(strace, "-f", "-qq", "-e", "trace=fsync,fdatasync,write", "-e", "signal=none", "-o", trace,
				os.Args[0], "-test.run=^TestSyncsBeforeAck$")
			cmd.Env = append(os.Environ(), helperEnv+"="+filepath.Join(dir, "store"), helperEnv+"_INTERVAL="+tc.interval)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("helper: %v\n%s", err, out)
			}
			data, err := os.ReadFile(trace)
			if err != nil {
				t.Fatal(err)
			}
			acks, synced, syncs := 0, 0, 0
			for _, line := range strings.Split(string(data), "\n") {
				switch {
				case strings.Contains(line, "fsync(") || strings.Contains(line, "fdatasync("):
					syncs++
				case strings.Contains(line, `write(2, "ready`):
					syncs = 0 // the stream's creation
				case strings.Contains(line, `write(2, "acked `):
					acks++
					if syncs > 0 {
						synced++
					}
					syncs = 0
				}
			}
			if acks != helperMessages {
				t.Fatalf("%d acks in the trace, want %d:\n%s", acks, helperMessages, data)
			}
			if tc.wantSynced && synced != acks {
				t.Fatalf("%d of %d PubAcks came after an fsync of the store", synced, acks)
			}
			if !tc.wantSynced && synced == acks {
				t.Fatalf("with a sync interval every one of %d PubAcks came after an fsync: the check cannot tell", acks)
			}
		})
	}
}

const helperMessages = 20

// TestMain runs the helper when the environment says so.
func TestMain(m *testing.M) {
	if dir := os.Getenv(helperEnv); dir != "" {
		if err := syncHelper(dir, os.Getenv(helperEnv+"_INTERVAL")); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func syncHelper(dir, interval string) error {
	var opts []Option
	if interval != "" {
		d, err := time.ParseDuration(interval)
		if err != nil {
			return err
		}
		opts = append(opts, SyncInterval(d))
	}
	s, err := Start(dir, "127.0.0.1:0", opts...)
	if err != nil {
		return err
	}
	defer s.Shutdown()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SYNC", Subjects: []string{"sync"}, Storage: jetstream.FileStorage}); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "ready")
	for i := range helperMessages {
		if _, err := js.Publish(ctx, "sync", []byte("batch")); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "acked %d\n", i)
	}
	return nil
}

// The store's limit is its filesystem's, not three quarters of what was
// free when the server started: a store started on a nearly full disk
// would refuse every message for good, the disk grown or not.
func TestStoreLimitIsTheDisks(t *testing.T) {
	st, err := StartStore(t.TempDir(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Server().Shutdown()
	if got := st.Server().JetStreamConfig().MaxStore; got != maxStore {
		t.Fatalf("JetStream's max store is %d, want %d (no limit of its own)", got, maxStore)
	}
	if p := st.Problem(); p != "" {
		t.Fatalf("a fresh store's problem: %s", p)
	}
}
