package consume

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/wire"
)

// Gaps is what a reader found of gaps in the stream (wire.Gap): how many,
// and the newest that no resync's message has followed yet.
type Gaps struct {
	mu    sync.Mutex
	count int
	open  string
}

// Note takes what wire.Chain.Follow said (nil: no gap) of a message with
// headers h, read by durable from stream: a gap is counted and said, unless
// the stream still holds its predecessor; a resync's message closes the
// open gap (it publishes every token the stream lacks again).
func (g *Gaps) Note(ctx context.Context, js jetstream.JetStream, stream, durable string, log *slog.Logger, h wire.Header, gap *wire.Gap) {
	if gap != nil && !gap.Resynced && PredecessorThere(ctx, js, stream, gap) {
		gap = nil
	}
	g.mu.Lock()
	healed := g.open != "" && h.Get(wire.HeaderResync) != ""
	switch {
	case gap != nil && !gap.Resynced:
		g.count++
		g.open = gap.Error()
	case healed:
		g.open = ""
	}
	g.mu.Unlock()
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

// State returns how many gaps were found, and the open one ("": none).
func (g *Gaps) State() (count int, open string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.count, g.open
}

// PredecessorThere reports whether stream holds gap's predecessor where
// the message after it says: then nothing was removed, and the durable's
// consumer went past it, delivering it to a subscriber of the durable
// whose record this one had not seen (one that took over from a subscriber
// that died before saving it). A stream that cannot say now counts as not
// holding it: the gap is said.
func PredecessorThere(ctx context.Context, js jetstream.JetStream, stream string, gap *wire.Gap) bool {
	if gap.Prev.Seq == 0 || js == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	there, err := StreamHolds(ctx, js, stream, gap.Prev.Seq, HoldsMark(gap.Prev.Mark), nil)
	return err == nil && there
}
