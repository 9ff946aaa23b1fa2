package main

// The group-commit designs compared on the server alone (-designs): how
// many batches a second an embedded server that syncs before every PubAck
// stores, sent as one message each, as JetStream atomic batches (ADR-50)
// of k messages, or as messages of k batches each (what the tailer does).

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/embedded"
)

// Design is one design at one group size.
type Design struct {
	Design          string  `json:"design"`
	BatchesPerGroup int     `json:"batches_per_group"`
	Batches         int     `json:"batches"`
	BatchesPerSec   float64 `json:"batches_per_second"`
}

// designBatch is a batch of ten tokens as the line format sends it: about
// 1,300 bytes of body, and ids and keys in the headers.
var designBatch = struct {
	body      []byte
	ids, keys string
}{[]byte(strings.Repeat("x", 1300)), strings.Repeat("123456,", 10), strings.Repeat("k", 230)}

func compareDesigns(dir string) ([]Design, error) {
	var out []Design
	for _, run := range []struct {
		design string
		k, n   int
	}{
		{"message per batch", 1, 5000},
		{"atomic batch", 2, 4000}, {"atomic batch", 10, 20000}, {"atomic batch", 50, 50000},
		{"batches in one message", 2, 10000}, {"batches in one message", 10, 20000}, {"batches in one message", 50, 50000},
	} {
		d, err := storeRate(filepath.Join(dir, fmt.Sprintf("designs-%d", len(out))), run.design, run.k, run.n)
		if err != nil {
			return nil, fmt.Errorf("%s, %d: %w", run.design, run.k, err)
		}
		fmt.Printf("%-24s %3d batches a group: %8.0f batches/s\n", d.Design, d.BatchesPerGroup, d.BatchesPerSec)
		out = append(out, d)
	}
	return out, nil
}

// storeRate stores n batches in groups of k with design and times it, with
// up to 16 messages (or 8 atomic batches) awaiting their PubAck.
func storeRate(dir, design string, k, n int) (Design, error) {
	d := Design{Design: design, BatchesPerGroup: k, Batches: n}
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(dir, "127.0.0.1:0")
	if err != nil {
		return d, err
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		return d, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(1024))
	if err != nil {
		return d, err
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "D", Subjects: []string{"d"}, Storage: jetstream.FileStorage, AllowAtomicPublish: true}); err != nil {
		return d, err
	}
	header := func(i, batches int) nats.Header {
		return nats.Header{"Mailroom-Token-Ids": {strings.Repeat(designBatch.ids, batches)}, "Mailroom-Token-Keys": {strings.Repeat(designBatch.keys, batches)}, "Nats-Msg-Id": {strconv.Itoa(i)}}
	}
	start := time.Now()
	if design == "atomic batch" {
		err = publishAtomic(nc, header, k, n)
	} else {
		err = publishMessages(js, header, k, n)
	}
	if err != nil {
		return d, err
	}
	d.BatchesPerSec = float64(n) / time.Since(start).Seconds()
	return d, nil
}

// publishMessages sends n/k messages of k batches each, chained like the
// tailer's.
func publishMessages(js jetstream.JetStream, header func(i, batches int) nats.Header, k, n int) error {
	body := []byte(strings.Repeat(string(designBatch.body), k))
	futs := make(chan jetstream.PubAckFuture, 16)
	errc := make(chan error, 1)
	go func() {
		var err error
		for f := range futs {
			select {
			case <-f.Ok():
			case e := <-f.Err():
				err = e
			}
		}
		errc <- err
	}()
	for i := 0; i < n/k; i++ {
		f, err := js.PublishMsgAsync(&nats.Msg{Subject: "d", Data: body, Header: header(i, k)}, jetstream.WithExpectLastSequence(uint64(i)))
		if err != nil {
			close(futs)
			<-errc
			return err
		}
		futs <- f
	}
	close(futs)
	return <-errc
}

// publishAtomic sends n/k atomic batches of k messages: only the first
// carries the expected last sequence (ADR-50 allows no more), only the
// commit asks for a reply.
func publishAtomic(nc *nats.Conn, header func(i, batches int) nats.Header, k, n int) error {
	inbox := nats.NewInbox()
	replies := make(chan *nats.Msg, 1024)
	sub, err := nc.ChanSubscribe(inbox+".*", replies)
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	inFlight := make(chan struct{}, 8)
	errc := make(chan error, 1)
	go func() {
		var err error
		for range inFlight {
			if r := <-replies; strings.Contains(string(r.Data), `"error"`) && err == nil {
				err = fmt.Errorf("commit: %s", r.Data)
			}
		}
		errc <- err
	}()
	for g := 0; g < n/k; g++ {
		id := "b" + strconv.Itoa(g)
		for j := 1; j <= k; j++ {
			h := header(g*k+j, 1)
			h["Nats-Batch-Id"] = []string{id}
			h["Nats-Batch-Sequence"] = []string{strconv.Itoa(j)}
			m := &nats.Msg{Subject: "d", Data: designBatch.body, Header: h}
			if j == 1 {
				h["Nats-Expected-Last-Sequence"] = []string{strconv.Itoa(g * k)}
			}
			if j == k {
				h["Nats-Batch-Commit"] = []string{"1"}
				m.Reply = inbox + "." + id
			}
			if err := nc.PublishMsg(m); err != nil {
				close(inFlight)
				<-errc
				return err
			}
		}
		inFlight <- struct{}{}
	}
	close(inFlight)
	return <-errc
}
