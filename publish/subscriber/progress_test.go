package subscriber_test

import (
	"context"
	"errors"
	"github.com/mailroom/tailer/publish/subscriber/protocol"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/embedded"
	"github.com/mailroom/tailer/publish/subscriber"
)

// progressServer is a real NATS server with stream S, connected to with
// conn's options, and opts applied to the server.
func progressServer(t *testing.T, ctx context.Context, conn []nats.Option, opts ...embedded.Option) jetstream.JetStream {
	t.Helper()
	srv, err := embedded.Start(t.TempDir(), "127.0.0.1:0", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL(), conn...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"b"}}); err != nil {
		t.Fatal(err)
	}
	return js
}

func TestKVProgress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js := progressServer(t, ctx, nil)
	a, err := subscriber.OpenProgress(ctx, js, "S", "d")
	if err != nil {
		t.Fatal(err)
	}
	p, rev, err := a.Load(ctx)
	if err != nil || rev != 0 || p.Floor != 0 {
		t.Fatalf("Load of nothing = %+v, %d, %v", p, rev, err)
	}
	for i := 1; i <= 3; i++ {
		p.Floor = uint64(i)
		if rev, err = a.Save(ctx, &p, rev); err != nil {
			t.Fatalf("save %d: %v", i, err)
		}
	}
	b, _ := subscriber.OpenProgress(ctx, js, "S", "d")
	got, brev, err := b.Load(ctx)
	if err != nil || brev != rev || got.Floor != 3 {
		t.Fatalf("the other's Load = %+v, %d, %v; want floor 3 at %d", got, brev, err, rev)
	}
	got.Floor = 10
	if _, err := b.Save(ctx, &got, brev); err != nil {
		t.Fatal(err)
	}
	// The first one's next save is refused: the other one delivers now.
	p.Floor = 4
	if _, err := a.Save(ctx, &p, rev); !errors.Is(err, subscriber.ErrTakenOver) {
		t.Fatalf("save after another's = %v, want ErrTakenOver", err)
	}
}

// The record is read from the bucket's leader (STREAM.MSG.GET), never by
// a direct get, which a follower of a replicated bucket answers with what
// it has, however far behind: a user that may not direct-get still loads
// and saves. A deleted record reads as none (at its marker's revision),
// and is made again.
func TestKVProgressReadsTheLeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js := progressServer(t, ctx, []nats.Option{nats.UserInfo("sub", "pw")}, func(o *server.Options) {
		o.Users = []*server.User{{Username: "sub", Password: "pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$JS.API.DIRECT.GET.>"}},
		}}}
	})
	a, err := subscriber.OpenProgress(ctx, js, "S", "d")
	if err != nil {
		t.Fatal(err)
	}
	p := protocol.Progress{Floor: 7}
	rev, err := a.Save(ctx, &p, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, grev, err := a.Load(ctx)
	if err != nil || grev != rev || got.Floor != 7 {
		t.Fatalf("Load = %+v at %d, %v; want floor 7 at %d", got, grev, err, rev)
	}
	kv, _ := js.KeyValue(ctx, subscriber.ProgressBucket("S"))
	if err := kv.Delete(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	got, grev, err = a.Load(ctx)
	if err != nil || got.Floor != 0 || grev == 0 {
		t.Fatalf("Load of a deleted record = %+v at %d, %v; want none, at the marker's revision", got, grev, err)
	}
	if _, err := a.Save(ctx, &p, grev); err != nil {
		t.Fatalf("making a deleted record again: %v", err)
	}
	if got, _, err := a.Load(ctx); err != nil || got.Floor != 7 {
		t.Fatalf("Load after = %+v, %v", got, err)
	}
}

// Another subscriber's record is not taken for this one's because it
// holds the same bytes: a subscriber frozen past the pin's TTL woke with
// its record pruned to the ack floor, byte for byte what the one that
// took over had saved, claimed it, and wrote the message it held again
// (the subscriber's simulation found it once it wrote through KVProgress).
func TestKVProgressClaimsNoIdenticalRecordOfAnother(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js := progressServer(t, ctx, nil)
	a, _ := subscriber.OpenProgress(ctx, js, "S", "d")
	b, _ := subscriber.OpenProgress(ctx, js, "S", "d")
	p := protocol.Progress{Floor: 1}
	rev, err := a.Save(ctx, &p, 0)
	if err != nil {
		t.Fatal(err)
	}
	same := protocol.Progress{Floor: 2}
	if _, err := b.Save(ctx, &same, rev); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Save(ctx, &same, rev); !errors.Is(err, subscriber.ErrTakenOver) {
		t.Fatalf("a save at a stale revision of the bytes another wrote = revision %d, %v; want ErrTakenOver", got, err)
	}
}
