package subscriber_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/subscriber"
)

// Webhook is a Sink of one's own: it posts each batch, as JSON, to URL,
// with the batch's place as the idempotency key, and says the batch done
// once the endpoint took it (2xx). A batch not taken ends the subscriber:
// its message comes again to the next one, without the batches done.
type Webhook struct {
	URL    string
	Client *http.Client
}

func (w Webhook) Hand(ctx context.Context, us []*subscriber.Unit, done func(...*subscriber.Unit)) error {
	for _, u := range us {
		body, err := json.Marshal(u.Tokens)
		if err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(body))
		if err != nil {
			return err
		}
		key := fmt.Sprintf("%s/%d", u.ID, u.Line)
		req.Header.Set("Idempotency-Key", key)
		resp, err := w.Client.Do(req)
		if err != nil {
			return fmt.Errorf("post batch %s: %w", key, err)
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("post batch %s: %s", key, resp.Status)
		}
		done(u)
	}
	return nil
}

// A subscriber hands the stream's batches to a sink of one's own, each
// message acknowledged once the sink said each of its batches is done.
func Example_customSink() {
	ctx := context.Background()
	var js jetstream.JetStream // connected to the tailer's NATS
	sub, err := subscriber.NewSubscriber(subscriber.Config{
		Stream: "MAILROOM", Subject: "mailroom.batches", Durable: "webhooks",
		Sink: Webhook{URL: "https://hooks.example/tokens", Client: http.DefaultClient},
		Log:  slog.Default(),
	})
	if err == nil {
		defer sub.Close()
		err = sub.Run(ctx, js)
	}
	if err != nil {
		slog.Error("webhooks", "err", err)
	}
}

// The example's sink on a real JetStream server, its endpoint failing
// once: the subscriber ends and hands its message back; every batch is
// taken, the one that failed is posted again and no other (the durable's
// record, saved as the subscriber ended, says which batches of its
// message are done), and nothing is left unacknowledged.
func TestCustomSink(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js := threeMessages(ctx, t)
	var (
		mu    sync.Mutex
		posts = map[string]int{}
		taken = map[string]bool{}
	)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		key := r.Header.Get("Idempotency-Key")
		if posts[key]++; key == "batch-b/1" && posts[key] == 1 {
			http.Error(w, "not now", http.StatusServiceUnavailable)
			return
		}
		taken[key] = true
	}))
	defer hook.Close()
	// Each run has half the ack wait: a message it was given and did not
	// finish comes to the next one only if the run handed it back.
	run := func() error {
		record, err := subscriber.OpenProgress(ctx, js, "S", "hooks")
		if err != nil {
			t.Fatal(err)
		}
		sub := newSubscriber(t, subscriber.Config{Stream: "S", Subject: "b", Durable: "hooks", FromStart: true, UntilDrained: true,
			Sink: Webhook{URL: hook.URL, Client: hook.Client()}, Progress: record, AckWait: 30 * time.Second})
		runCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		return sub.Run(runCtx, js)
	}
	if err := run(); err == nil {
		t.Fatal("the endpoint failed a batch and the subscriber went on")
	}
	// Run saved, as it ended, that the first batch of message 2 is done.
	record, err := subscriber.OpenProgress(ctx, js, "S", "hooks")
	if err != nil {
		t.Fatal(err)
	}
	if p, _, err := record.Load(ctx); err != nil || p.Messages[2] == nil || !p.Messages[2].Done.Has(0) || p.Messages[2].Done.Has(1) {
		t.Fatalf("the record as the subscriber ended: %+v (%v); want message 2's batch 0 done, batch 1 not", p.Messages[2], err)
	}
	if err := run(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range []string{"batch-a", "batch-b", "batch-c"} {
		for line := range 2 {
			key := fmt.Sprintf("%s/%d", id, line)
			if !taken[key] {
				t.Errorf("batch %s never taken (posts %v)", key, posts)
			}
			if key != "batch-b/1" && posts[key] != 1 {
				t.Errorf("batch %s posted %d times, want once (posts %v)", key, posts[key], posts)
			}
		}
	}
	if posts["batch-b/1"] != 2 {
		t.Errorf("the batch that failed was posted %d times, want 2 (posts %v)", posts["batch-b/1"], posts)
	}
	cons, err := js.Consumer(ctx, "S", "hooks")
	if err != nil {
		t.Fatal(err)
	}
	if info, err := cons.Info(ctx); err != nil || info.NumPending != 0 || info.NumAckPending != 0 {
		t.Fatalf("consumer: %+v, %v; want nothing pending or unacknowledged", info, err)
	}
}
