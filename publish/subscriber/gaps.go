package subscriber

import (
	"context"
	"log/slog"
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

// Note takes what wire.Chain.Follow said (nil: no gap) of a message with
// headers h, read by durable from stream: a gap is counted and said, unless
// the stream still holds its predecessor; a resync's message closes the
// open gap (it publishes every token the stream lacks again). A
// predecessor the stream holds, on a durable that does not pin one
// subscriber (pinned false), went to another client: said as an error.
// A durable shared by its subscribers (shared: an inbox's or River's)
// gives each a share of every chain: see protocol.OnGap. A stream that
// did not answer before the subscriber stopped judges nothing: the
// subscriber says so, and no gap. keep (nil: none) keeps the message
// held while the stream is asked.
func (g *Gaps) Note(ctx context.Context, js jetstream.JetStream, stream, durable string, pinned, shared bool, log *slog.Logger, h wire.Header, gap *wire.Gap, keep func()) {
	if gap != nil && !gap.Resynced {
		there, known := PredecessorThere(ctx, js, stream, gap, keep)
		if !known {
			if log != nil {
				log.Info("stopping before the stream said whether a message before this one is still there: not judged", "durable", durable, "gap", gap.Error())
			}
			return
		}
		switch protocol.OnGap(there, pinned, shared) {
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
		log.Error("messages missing: removed from the stream before this durable read them; run tailer resync to publish their tokens again (they reach no reader otherwise)",
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
	give := time.Now().Add(predecessorPatience)
	for {
		try, cancel := context.WithTimeout(ctx, 2*time.Second)
		if ctx.Err() != nil {
			try, cancel = context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		}
		there, err := StreamHolds(try, js, stream, gap.Prev.Seq, HoldsMark(gap.Prev.Mark), nil)
		cancel()
		switch {
		case err == nil:
			return there, true
		case ctx.Err() != nil:
			return false, false
		case time.Now().After(give):
			return false, true
		}
		if keep != nil {
			keep()
		}
	}
}
