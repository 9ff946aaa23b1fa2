package publish

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/relay"
	"github.com/mailroom/tailer/publish/wire"
)

// Trims reports whether a stream of configuration c removes old messages
// by itself: limits that discard the oldest (max_msgs, max_bytes), a
// per-subject limit unless it discards new ones per subject too, an age
// limit, or a retention that removes what was consumed. max_msgs and
// max_bytes with discard new remove nothing: they refuse new messages
// once reached, and a message gone from such a stream was removed by
// someone.
func Trims(c jetstream.StreamConfig) bool {
	old := c.Discard == jetstream.DiscardOld && (c.MaxMsgs > 0 || c.MaxBytes > 0)
	perSubject := c.MaxMsgsPerSubject > 0 && !c.DiscardNewPerSubject
	return old || perSubject || c.MaxAge > 0 || c.Retention != jetstream.LimitsPolicy
}

// keeps is the most messages a stream of configuration c keeps when a
// limit of messages alone removes its old ones (max_msgs, discard old);
// 0 when something else may remove them too, or nothing does.
func keeps(c jetstream.StreamConfig) uint64 {
	if c.Discard != jetstream.DiscardOld || c.MaxMsgs <= 0 || c.MaxBytes > 0 || c.MaxAge > 0 ||
		c.MaxMsgsPerSubject > 0 && !c.DiscardNewPerSubject || c.Retention != jetstream.LimitsPolicy {
		return 0
	}
	return uint64(c.MaxMsgs)
}

// limitsOf says which of c's limits remove old messages ("" for none).
func limitsOf(c jetstream.StreamConfig) string {
	var l []string
	if c.Discard == jetstream.DiscardOld {
		for _, v := range []struct {
			name string
			n    int64
		}{{"max_msgs", c.MaxMsgs}, {"max_bytes", c.MaxBytes}} {
			if v.n > 0 {
				l = append(l, v.name+"="+strconv.FormatInt(v.n, 10))
			}
		}
	}
	if c.MaxMsgsPerSubject > 0 && !c.DiscardNewPerSubject {
		l = append(l, "max_msgs_per_subject="+strconv.FormatInt(c.MaxMsgsPerSubject, 10))
	}
	return strings.Join(l, ", ")
}

// Limits says the stream's limits that removed old messages as the
// session started ("" for none).
func (p *Publisher) Limits() string { return p.limits }

// Limited reports whether the stream's configuration removed old
// messages as the session started (Trims).
func (p *Publisher) Limited() bool { return p.limited }

// Look reads the stream's info as it is now: when its server created it
// (another time than Created: another stream under its name, or another
// replica answering), what it holds, and whether its configuration (as
// it is now) removes old messages. It may run beside the publishing
// goroutine.
func (p *Publisher) Look(ctx context.Context) (created string, seen relay.Seen, err error) {
	info, err := p.stream.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		return "", relay.Seen{}, fmt.Errorf("stream %s: %w", p.name, err)
	}
	p.sawLeader(info)
	return info.Created.UTC().Format(time.RFC3339Nano), p.seenOf(info), nil
}

// seenOf is SeenOf for the publisher's subject.
func (p *Publisher) seenOf(info *jetstream.StreamInfo) relay.Seen { return SeenOf(info, p.subject) }

// SeenOf is what a stream's info says it holds. A stream that never held
// a message has first sequence zero; one purged empty, one past its
// last. Its batches are the messages on subject's batch subjects
// (wire.DataSubjects), counted when info has the messages by subject
// (read with a subject filter); whether it trims is its configuration's.
func SeenOf(info *jetstream.StreamInfo, subject string) relay.Seen {
	st := info.State
	seen := relay.Seen{Known: true, First: st.FirstSeq, Last: st.LastSeq, Deleted: st.NumDeleted, Trims: Trims(info.Config), Keeps: keeps(info.Config)}
	if st.LastSeq == 0 {
		seen.First = 0
	}
	for _, s := range wire.DataSubjects(subject) {
		seen.Batches += st.Subjects[s]
	}
	return seen
}

// LookQuietly is Look with nothing of this publisher's on its way to the
// stream (Seen.Quiet), and the batch messages stored by then: sending is
// held until every batch sent before has its PubAck, for at most the
// time ctx leaves. Without every PubAck in time, it is Look, not quiet.
func (p *Publisher) LookQuietly(ctx context.Context) (created string, seen relay.Seen, stored uint64, err error) {
	p.sending.Lock()
	defer p.sending.Unlock()
	quiet := p.settle(ctx)
	created, seen, err = p.Look(ctx)
	stored = p.StoredBatches()
	seen.Quiet = quiet && err == nil
	return created, seen, stored, err
}

// settle waits until every batch message sent has its PubAck, or ctx is
// done; it reports whether they all had.
func (p *Publisher) settle(ctx context.Context) bool {
	a := &p.anchors
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.settled.L == nil {
		a.settled.L = &a.mu
	}
	stop := context.AfterFunc(ctx, func() {
		a.mu.Lock()
		a.settled.Broadcast()
		a.mu.Unlock()
	})
	defer stop()
	for a.ackedN < a.sentN && ctx.Err() == nil {
		a.settled.Wait()
	}
	return a.ackedN >= a.sentN
}

// StoredBatches is how many batch messages the session added to the
// stream so far (PubAck in hand, not a duplicate of one it held).
func (p *Publisher) StoredBatches() uint64 {
	p.anchors.mu.Lock()
	defer p.anchors.mu.Unlock()
	return p.anchors.appendedN
}
