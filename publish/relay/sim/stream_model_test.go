package sim

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"pgregory.net/rapid"

	"github.com/mailroom/tailer/internal/embedded"
	"github.com/mailroom/tailer/internal/testutil/natstest"
	"github.com/mailroom/tailer/publish"
)

// The stream model does what a real JetStream stream does with the
// operations the simulation uses: the same sequences of publishes (with
// an id or none, expecting a last sequence or not), purges (whole, of the
// batches' subject, of the session markers' subject), deletions, max_msgs
// limits that discard the oldest or refuse the new, limits edited while
// the stream is in use (set, lowered, taken off, their discard policy
// changed) and the stream made again, on the model and on an embedded
// nats-server, give the same answers (the sequence, a duplicate, a wrong
// last sequence, a full stream's refusal) and leave the same messages, at
// the same sequences, with the same info (publish.SeenOf: the batches
// counted, whether its configuration removes old messages).
func TestStreamModelAgreesWithJetStream(t *testing.T) {
	_, js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n := 0
	rapid.Check(t, func(rt *rapid.T) {
		n++
		c := &streamCheck{ctx: ctx, js: js, name: "S" + strconv.Itoa(n)}
		c.maxMsgs = rapid.SampledFrom([]int{0, 3}).Draw(rt, "max_msgs")
		c.discardNew = rapid.Bool().Draw(rt, "discard new")
		c.made = new(int)
		c.make(rt)
		rt.Repeat(map[string]func(*rapid.T){
			"publish":        c.publish,
			"purge":          func(rt *rapid.T) { c.purge(rt, "") },
			"purge subject":  func(rt *rapid.T) { c.purge(rt, "b") },
			"purge markers":  func(rt *rapid.T) { c.purge(rt, "b._session") },
			"edit limits":    c.editLimits,
			"delete":         c.delete,
			"made again":     c.make,
			"":               c.agree,
			"publish again":  c.publishAgain,
			"publish marker": c.publishMarker,
		})
	})
}

// streamCheck runs each operation on the model and on a real stream.
type streamCheck struct {
	ctx        context.Context
	js         jetstream.JetStream
	name       string
	maxMsgs    int
	discardNew bool
	made       *int
	model      *streamModel
	real       jetstream.Stream
	ids        []string
}

func (c *streamCheck) make(rt *rapid.T) {
	if err := c.js.DeleteStream(c.ctx, c.name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		rt.Fatal(err)
	}
	s, err := c.js.CreateStream(c.ctx, c.config())
	if err != nil {
		rt.Fatal(err)
	}
	c.real, c.model = s, newStream(c.name, c.maxMsgs, c.made)
	c.model.discardNew = c.discardNew
	c.agree(rt)
}

// config is the real stream's configuration, as the check's limits say.
func (c *streamCheck) config() jetstream.StreamConfig {
	cfg := jetstream.StreamConfig{Name: c.name, Subjects: []string{c.name + ".>"}, Storage: jetstream.MemoryStorage, Duplicates: time.Minute, MaxMsgs: -1}
	if c.maxMsgs > 0 {
		cfg.MaxMsgs = int64(c.maxMsgs)
	}
	if c.discardNew {
		cfg.Discard = jetstream.DiscardNew
	}
	return cfg
}

// editLimits edits the stream's limit while it is in use: set, lowered or
// taken off, discarding the oldest or refusing the new.
func (c *streamCheck) editLimits(rt *rapid.T) {
	c.maxMsgs = rapid.SampledFrom([]int{0, 2, 3, 5}).Draw(rt, "max_msgs now")
	c.discardNew = rapid.Bool().Draw(rt, "discard new now")
	if _, err := c.js.UpdateStream(c.ctx, c.config()); err != nil {
		rt.Fatal(err)
	}
	c.model.limit(c.maxMsgs, c.discardNew)
	c.agree(rt)
}

// publish publishes a batch on subject b with an id the check has not
// used, expecting the stream's last sequence, or one off it, or any.
func (c *streamCheck) publish(rt *rapid.T) {
	id := fmt.Sprintf("id-%d", len(c.ids)+1)
	c.ids = append(c.ids, id)
	c.put(rt, "b", id, c.expect(rt))
}

// publishAgain publishes an id used before: JetStream's duplicate window
// (a minute here, longer than the check) answers with its sequence,
// whatever became of the message since.
func (c *streamCheck) publishAgain(rt *rapid.T) {
	if len(c.ids) == 0 {
		rt.Skip("no id used yet")
	}
	c.put(rt, "b", rapid.SampledFrom(c.ids).Draw(rt, "id"), c.expect(rt))
}

// publishMarker publishes a session marker: no id, chained.
func (c *streamCheck) publishMarker(rt *rapid.T) {
	c.put(rt, "b._session", "", int64(c.model.last))
}

func (c *streamCheck) expect(rt *rapid.T) int64 {
	switch rapid.IntRange(0, 4).Draw(rt, "expect") {
	case 0:
		return -1
	case 1:
		return int64(c.model.last) + 1
	case 2:
		// A publish chained before the last message (one landing late);
		// 0 on a stream of one message.
		if c.model.last > 0 {
			return int64(c.model.last) - 1
		}
	}
	return int64(c.model.last)
}

func (c *streamCheck) put(rt *rapid.T, subject, id string, expect int64) {
	m := msg{id: id}
	m.Subject = subject
	wantSeq, wantDup, wantErr := c.model.publish(m, expect)
	var opts []jetstream.PublishOpt
	if id != "" {
		opts = append(opts, jetstream.WithMsgID(id))
	}
	if expect >= 0 {
		opts = append(opts, jetstream.WithExpectLastSequence(uint64(expect)))
	}
	ack, err := c.js.Publish(c.ctx, c.name+"."+subject, []byte(id), opts...)
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(wantErr, errWrongLastSeq):
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
			rt.Fatalf("publish %q expecting %d: the model refused it (wrong last sequence), JetStream answered %+v, %v", id, expect, ack, err)
		}
	case errors.Is(wantErr, errFull):
		if !errors.As(err, &apiErr) || !strings.Contains(apiErr.Description, errFull.Error()) {
			rt.Fatalf("publish %q expecting %d: the model refused it (full), JetStream answered %+v, %v", id, expect, ack, err)
		}
	case err != nil:
		rt.Fatalf("publish %q expecting %d: the model stored it at %d (duplicate %v), JetStream refused it: %v", id, expect, wantSeq, wantDup, err)
	case ack.Sequence != wantSeq || ack.Duplicate != wantDup:
		rt.Fatalf("publish %q expecting %d: the model says seq %d duplicate %v, JetStream seq %d duplicate %v", id, expect, wantSeq, wantDup, ack.Sequence, ack.Duplicate)
	}
	c.agree(rt)
}

func (c *streamCheck) purge(rt *rapid.T, subject string) {
	c.model.purge(subject)
	var opts []jetstream.StreamPurgeOpt
	if subject != "" {
		opts = append(opts, jetstream.WithPurgeSubject(c.name+"."+subject))
	}
	if err := c.real.Purge(c.ctx, opts...); err != nil {
		rt.Fatal(err)
	}
	c.agree(rt)
}

func (c *streamCheck) delete(rt *rapid.T) {
	seqs := c.model.seqs()
	if len(seqs) == 0 {
		rt.Skip("no message to delete")
	}
	seq := rapid.SampledFrom(seqs).Draw(rt, "seq")
	c.model.deleteMsg(seq)
	if err := c.real.DeleteMsg(c.ctx, seq); err != nil {
		rt.Fatal(err)
	}
	c.agree(rt)
}

// agree compares the stream's info and every message with the model's.
func (c *streamCheck) agree(rt *rapid.T) {
	info, err := c.real.Info(c.ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		rt.Fatal(err)
	}
	if got, want := publish.SeenOf(info, c.name+".b"), c.model.seen(); got != want {
		rt.Fatalf("stream info: JetStream %+v (state %+v), the model %+v", got, info.State, want)
	}
	for seq := uint64(1); seq <= c.model.last; seq++ {
		m, err := c.real.GetMsg(c.ctx, seq)
		want, held := c.model.msgs[seq]
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound) && !held:
		case err != nil:
			rt.Fatalf("message %d: %v (the model holds %v)", seq, err, held)
		case !held:
			rt.Fatalf("message %d: JetStream holds it, the model does not", seq)
		case m.Header.Get(jetstream.MsgIDHeader) != want.id || m.Subject != c.name+"."+want.Subject:
			rt.Fatalf("message %d: JetStream %s %q, the model %s %q", seq, m.Subject, m.Header.Get(jetstream.MsgIDHeader), want.Subject, want.id)
		}
	}
	for _, subject := range []string{"b", "b._session"} {
		m, err := c.real.GetLastMsgForSubject(c.ctx, c.name+"."+subject)
		want, held := c.model.lastOn(subject)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound) && !held:
		case err != nil:
			rt.Fatalf("last message on %s: %v (the model holds %v)", subject, err, held)
		case !held || m.Sequence != want.Seq:
			rt.Fatalf("last message on %s: JetStream at %d, the model at %d (%v)", subject, m.Sequence, want.Seq, held)
		}
	}
}

// No removal lowers a real stream's last sequence, the restart of its
// server included: a purge of the subject its last messages are on, or
// their deletion, leaves it where it was, as the model does. The relay
// holds an anchor gone past the last sequence to be a stream made again
// or restored (relay's pastLast); a server that lowered it would be
// refused for a purge. (The model's agreement above holds it without a
// restart.)
func TestLastSequenceOutlivesRemovals(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	for _, remove := range []string{"purge of the last messages' subject", "the last messages deleted"} {
		srv, err := embedded.Start(dir, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect(srv.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		js, _ := jetstream.New(nc)
		name := "S" + strconv.Itoa(len(remove))
		s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.FileStorage})
		if err != nil {
			t.Fatal(err)
		}
		for _, subject := range []string{"b", "b", "m", "m"} {
			if _, err := js.Publish(ctx, name+"."+subject, nil); err != nil {
				t.Fatal(err)
			}
		}
		if remove == "the last messages deleted" {
			err = errors.Join(s.DeleteMsg(ctx, 4), s.DeleteMsg(ctx, 3))
		} else {
			err = s.Purge(ctx, jetstream.WithPurgeSubject(name+".m"))
		}
		if err != nil {
			t.Fatal(err)
		}
		nc.Close()
		srv.Shutdown()
		srv.WaitForShutdown()
		if srv, err = embedded.Start(dir, "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		nc, err = nats.Connect(srv.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		js, _ = jetstream.New(nc)
		if s, err = js.Stream(ctx, name); err != nil {
			t.Fatal(err)
		}
		if last := s.CachedInfo().State.LastSeq; last != 4 {
			t.Errorf("%s, the server restarted: last sequence %d, want 4", remove, last)
		}
		nc.Close()
		srv.Shutdown()
		srv.WaitForShutdown()
	}
}
