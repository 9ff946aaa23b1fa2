package relay

import (
	"github.com/mailroom/tailer/decoder/wal"
	"slices"
	"strings"

	"github.com/mailroom/tailer/publish/token"
)

// Window is what the stream holds of the tokens a session replays: every
// message of the session's incarnation that covers a position at or after
// the slot's confirmed one, by the positions it covers. Its keys are read
// back as the replay reaches them (Has).
//
// The messages are indexed by the WAL positions they cover, so that a
// message's token keys are read from the stream only once the replay
// reaches its positions, and only one message's keys at a time are held
// for each run of messages that do not overlap (a lane's): what a resume
// keeps grows with the window's messages, about fifty bytes each, not with
// its tokens (issue 47: sixteen bytes a token, 56 MB for a replay of 3.5
// million, read back whole before the first was published).
//
// A message's tokens lie within the positions it covers: a message holds
// consecutive batches of one lane, and a lane's tokens come in commit
// order. So a token on the stream is in one of the messages whose span
// holds its position; looking only there skips nothing the stream does
// not hold, whatever order the messages landed in.
type Window struct {
	all []span
	// chains are all's indices, parted into runs of spans that do not
	// overlap, each sorted by position: one a lane, mostly. Made by the
	// first lookup.
	chains [][]int
	// held is, for each chain, the message whose keys were read last.
	held []heldKeys

	// Tokens counts the keys of the window's messages, Messages the
	// messages; Max is the furthest position they cover (a token past it
	// cannot be on the stream), Floor their lowest sequence (0: none).
	Tokens, Messages int
	Max              wal.Position
	Floor            uint64
	// Strays counts the messages read that are neither batches nor
	// markers (another publisher's); Fence is the number of markers the
	// session started with.
	Strays, Fence int
}

// span is one message of the window: where it is, and the first and last
// positions its batches cover.
type span struct {
	seq         uint64
	first, last wal.Position
}

// heldKeys are the keys of the message at seq (0: none; a stream's
// sequences start at 1).
type heldKeys struct {
	seq  uint64
	keys token.KeySet
}

// Add notes m as a message of the window. A message of a tailer before
// the first-position header covers every position up to its last.
func (w *Window) Add(m Published) {
	w.all = append(w.all, span{seq: m.Seq, first: m.First, last: m.Last})
	w.chains, w.held = nil, nil
	if m.Keys != "" {
		w.Tokens += strings.Count(m.Keys, ",") + 1
	}
	if w.Max.Less(m.Last) {
		w.Max = m.Last
	}
	if w.Floor == 0 || m.Seq < w.Floor {
		w.Floor = m.Seq
	}
	w.Messages++
}

// chain parts the spans into runs that do not overlap, each in position
// order: a span goes to the first run whose last span ends before it.
func (w *Window) chain() {
	order := make([]int, len(w.all))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return w.all[a].first.Compare(w.all[b].first) })
	w.chains = w.chains[:0]
	for _, i := range order {
		placed := false
		for c, run := range w.chains {
			if w.all[run[len(run)-1]].last.Less(w.all[i].first) {
				w.chains[c] = append(run, i)
				placed = true
				break
			}
		}
		if !placed {
			w.chains = append(w.chains, []int{i})
		}
	}
	w.held = make([]heldKeys, len(w.chains))
}

// Has reports whether the stream holds the token of key at pos: a message
// of the window whose span holds pos carries key. It reads the keys of
// such a message with read (the message's keys, comma-joined) when they
// are not held already.
func (w *Window) Has(pos wal.Position, key token.RawKey, read func(seq uint64) (string, error)) (bool, error) {
	if len(w.all) == 0 || w.Max.Less(pos) {
		return false, nil
	}
	if w.chains == nil {
		w.chain()
	}
	for c, run := range w.chains {
		// The first span of the run that ends at pos or after.
		k, _ := slices.BinarySearchFunc(run, pos, func(i int, pos wal.Position) int { return w.all[i].last.Compare(pos) })
		if k == len(run) || pos.Less(w.all[run[k]].first) {
			continue
		}
		sp := w.all[run[k]]
		h := &w.held[c]
		if h.seq != sp.seq {
			keys, err := read(sp.seq)
			if err != nil {
				return false, err
			}
			h.seq, h.keys = sp.seq, token.KeySet{}
			for k := range strings.SplitSeq(keys, ",") {
				h.keys.Add(k)
			}
		}
		if h.keys.Has(key) {
			return true, nil
		}
	}
	return false, nil
}
