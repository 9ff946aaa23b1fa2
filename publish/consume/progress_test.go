package consume_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/embedded"
	"github.com/mailroom/tailer/publish/consume"
)

func TestKVProgress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := embedded.Start(t.TempDir(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"b"}}); err != nil {
		t.Fatal(err)
	}
	a, err := consume.OpenProgress(ctx, js, "S", "d")
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
	b, _ := consume.OpenProgress(ctx, js, "S", "d")
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
	if _, err := a.Save(ctx, &p, rev); !errors.Is(err, consume.ErrTakenOver) {
		t.Fatalf("save after another's = %v, want ErrTakenOver", err)
	}
}
