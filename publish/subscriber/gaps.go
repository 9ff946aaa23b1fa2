package subscriber

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/subscriber/protocol"
	"github.com/mailroom/tailer/publish/wire"
)

// Gaps is what a reader found of gaps in the stream (wire.Gap): how many,
// the newest that no resync's message has followed yet, and how many
// messages another client of the durable was given. One goroutine notes
// them (the consume loop); any reads them.
type Gaps struct {
	count, taken atomic.Int64
	open         atomic.Pointer[string]
}

// GapCheck is what Gaps.Note judges a gap by, for durable reading from
// Stream: the stream (does it hold the predecessor?), the sink's own
// record (did it store it?) and the durable's kind.
type GapCheck struct {
	JS              jetstream.JetStream
	Stream, Durable string
	// Pinned: the durable pins one subscriber.
	Pinned bool
	// Sink keeps a record of its own (nil: none): the durable is shared
	// by its subscribers (protocol.OnGap), and Sink says whether it
	// stored a message.
	Sink Positioner
	Log  *slog.Logger
}

// Note takes what wire.Chain.Follow said (nil: no gap) of a message with
// headers h: a gap is counted and said, unless the stream still holds its
// predecessor or the sink says it stored it; a resync's message closes
// the open gap (it publishes every token the stream lacks again). A
// predecessor the stream holds, on a durable that does not pin one
// subscriber, went to another client: said as an error. A durable shared
// by its subscribers (an inbox's or River's) gives each a share of every
// chain: see protocol.OnGap. A stream or sink that did not answer before
// the subscriber stopped judges nothing: the subscriber says so, and no
// gap. keep (nil: none) keeps the message held while they are asked.
func (g *Gaps) Note(ctx context.Context, c GapCheck, h wire.Header, gap *wire.Gap, keep func()) {
	log, durable := c.Log, c.Durable
	if gap != nil && !gap.Resynced {
		verdict, known := c.judge(ctx, gap, keep)
		if !known {
			if log != nil {
				log.Info("stopping before the stream or the sink said whether a message before this one is still there or stored: not judged", "durable", durable, "gap", gap.Error())
			}
			return
		}
		switch verdict {
		case protocol.NotMissing:
			gap = nil
		case protocol.TakenElsewhere:
			g.takenElsewhere(durable, log, gap)
			return
		}
	}
	_, open := g.State()
	healed := open != "" && h.Get(wire.HeaderResync) != ""
	switch {
	case gap != nil && !gap.Resynced:
		g.count.Add(1)
		said := gap.Error()
		g.open.Store(&said)
	case healed:
		g.open.Store(nil)
	}
	if log == nil {
		return
	}
	switch {
	case gap != nil && gap.Resynced:
		log.Warn("messages missing before a resync's: removed from the stream before this durable read them; the resync publishes their tokens again",
			"durable", durable, "gap", gap.Error())
	case gap != nil:
		log.Error("messages missing: removed from the stream before this durable read them, or before the subscriber that read them, since killed, said it wrote them; run tailer resync to publish their tokens again (they reach no reader otherwise; readers drop by key those they had)",
			"durable", durable, "gap", gap.Error())
	case healed:
		log.Info("a resync's message follows the gap: the resync publishes the tokens removed again", "durable", durable)
	}
}

// takenElsewhere counts and says gap's predecessor given to a client
// that is not this subscriber.
func (g *Gaps) takenElsewhere(durable string, log *slog.Logger, gap *wire.Gap) {
	g.taken.Add(1)
	if log != nil {
		log.Error("a message of this durable was given to another client, not to this subscriber, which never wrote its tokens: the consumer does not pin one subscriber, so any client pulling from it (a second subscriber, nats consumer next) takes messages; stop that client, and delete the consumer to have tailer subscribe make it again pinned",
			"durable", durable, "taken_stream_seq", gap.Prev.Seq, "taken_mark", gap.Prev.Mark, "next_stream_seq", gap.Seq, "subject", gap.Subject)
	}
}

// State returns how many gaps were found, and the open one ("": none).
func (g *Gaps) State() (count int, open string) {
	if o := g.open.Load(); o != nil {
		open = *o
	}
	return int(g.count.Load()), open
}

// Taken returns how many messages of the durable were found given to
// another client.
func (g *Gaps) Taken() int { return int(g.taken.Load()) }

// predecessorPatience is how long PredecessorThere asks a stream that
// cannot answer (a leader being elected, a node away or partitioned: a
// cluster heals those in seconds) before it says the gap: a gap said
// because the stream was slow to answer would send an operator to run a
// resync for nothing.
const predecessorPatience = 2 * time.Minute

// judge asks the stream whether it holds gap's predecessor and, when it
// does not, the sink whether it stored it, for protocol.OnGap.
func (c GapCheck) judge(ctx context.Context, gap *wire.Gap, keep func()) (v protocol.GapVerdict, known bool) {
	there, known := PredecessorThere(ctx, c.JS, c.Stream, gap, keep)
	if !known {
		return 0, false
	}
	stored := false
	if !there && c.Sink != nil {
		if stored, known = sinkStored(ctx, c.Sink, c.Stream, c.Durable, gap.Prev, keep); !known {
			return 0, false
		}
	}
	return protocol.OnGap(there, stored, c.Pinned, c.Sink != nil), true
}

// sinkStored reports whether sink's own record holds a token durable
// stored of the message at (its place and id): asked patiently, as
// PredecessorThere asks the stream (a database restarting answers in
// seconds), and not stored when it never answers.
func sinkStored(ctx context.Context, sink Positioner, stream, durable string, at wire.Anchor, keep func()) (stored, known bool) {
	id, ok := strings.CutPrefix(at.Mark, wire.IDMark(""))
	if !ok || at.Seq == 0 {
		return false, true
	}
	known = patiently(ctx, keep, func(try context.Context) error {
		s, err := sink.Holds(try, stream, durable, at.Seq, id)
		stored = s && err == nil
		return err
	})
	return stored, known
}

// PredecessorThere reports whether stream holds gap's predecessor where
// the message after it says: then nothing was removed, and the durable's
// consumer went past it, delivering it to a subscriber of the durable
// whose record this one had not seen (one that took over from a subscriber
// whose last saves had not landed). A stream that cannot answer is asked
// again, keep called between tries, for predecessorPatience; after that
// it counts as not holding it: the gap is said. Asked to stop meanwhile
// (ctx done), it asks once more, briefly: a stream that does not answer
// then leaves it unknown (known false), not missing: a subscriber stopped
// while it asked said messages missing that were not (issue 71).
func PredecessorThere(ctx context.Context, js jetstream.JetStream, stream string, gap *wire.Gap, keep func()) (there, known bool) {
	if gap.Prev.Seq == 0 || js == nil {
		return false, true
	}
	known = patiently(ctx, keep, func(try context.Context) error {
		t, err := StreamHolds(try, js, stream, gap.Prev.Seq, HoldsMark(gap.Prev.Mark), nil)
		there = t && err == nil
		return err
	})
	return there, known
}

// patiently asks ask, each try bounded to 2 s, until it answers (known),
// keep called between tries; for predecessorPatience, after which the
// question counts as answered in the negative. Asked to stop meanwhile
// (ctx done), it asks once more, briefly: no answer then leaves it
// unknown.
func patiently(ctx context.Context, keep func(), ask func(try context.Context) error) (known bool) {
	give := time.Now().Add(predecessorPatience)
	for {
		try, cancel := context.WithTimeout(ctx, 2*time.Second)
		if ctx.Err() != nil {
			try, cancel = context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		}
		err := ask(try)
		cancel()
		switch {
		case err == nil:
			return true
		case ctx.Err() != nil:
			return false
		case time.Now().After(give):
			return true
		}
		if keep != nil {
			keep()
		}
	}
}
