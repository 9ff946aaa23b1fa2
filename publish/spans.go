package publish

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/publish/token"
)

// spans index the messages of a resume's window by the WAL positions they
// cover, so that a message's token keys are read back from the stream only
// once the replay reaches its positions, and only one message's keys at a
// time are held for each run of messages that do not overlap (a lane's):
// what a resume keeps grows with the window's messages, about fifty bytes
// each, not with its tokens (issue 47: sixteen bytes a token, 56 MB for a
// replay of 3.5 million, read back whole before the first was published).
//
// A message's tokens lie within the positions it covers (HeaderPosFirst to
// HeaderPosLast): a message holds consecutive batches of one lane, and a
// lane's tokens come in commit order. So a token on the stream is in one
// of the messages whose span holds its position; looking only there
// skips nothing the stream does not hold, whatever order the messages
// landed in.
type spans struct {
	all []span
	// chains are all's indices, parted into runs of spans that do not
	// overlap, each sorted by position: one a lane, mostly. Made by the
	// first lookup.
	chains [][]int
	// held is, for each chain, the message whose keys were read last.
	held []heldKeys
}

// span is one message of the window: where it is, and the first and last
// positions its batches cover.
type span struct {
	seq         uint64
	first, last decoder.Position
}

// heldKeys are the keys of the message at seq (0: none; a stream's
// sequences start at 1).
type heldKeys struct {
	seq  uint64
	keys token.KeySet
}

// add notes the message at seq covering first to last. A message of a
// tailer before HeaderPosFirst covers every position up to last.
func (s *spans) add(seq uint64, first, last decoder.Position) {
	s.all = append(s.all, span{seq: seq, first: first, last: last})
	s.chains, s.held = nil, nil
}

func (s *spans) len() int { return len(s.all) }

// chain parts the spans into runs that do not overlap, each in position
// order: a span goes to the first run whose last span ends before it.
func (s *spans) chain() {
	order := make([]int, len(s.all))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return s.all[a].first.Compare(s.all[b].first) })
	s.chains = s.chains[:0]
	for _, i := range order {
		placed := false
		for c, run := range s.chains {
			if s.all[run[len(run)-1]].last.Less(s.all[i].first) {
				s.chains[c] = append(run, i)
				placed = true
				break
			}
		}
		if !placed {
			s.chains = append(s.chains, []int{i})
		}
	}
	s.held = make([]heldKeys, len(s.chains))
}

// has reports whether a message whose span holds pos carries key, reading
// the keys of such a message with read when they are not held already.
func (s *spans) has(ctx context.Context, pos decoder.Position, key token.RawKey, read func(context.Context, uint64) (string, error)) (bool, error) {
	if len(s.all) == 0 {
		return false, nil
	}
	if s.chains == nil {
		s.chain()
	}
	for c, run := range s.chains {
		// The first span of the run that ends at pos or after.
		k, _ := slices.BinarySearchFunc(run, pos, func(i int, pos decoder.Position) int { return s.all[i].last.Compare(pos) })
		if k == len(run) || pos.Less(s.all[run[k]].first) {
			continue
		}
		sp := s.all[run[k]]
		h := &s.held[c]
		if h.seq != sp.seq {
			keys, err := read(ctx, sp.seq)
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

// errWindowGone is a message of the window gone from the stream between
// the scan and the replay.
func errWindowGone(stream string, seq uint64) error {
	return fmt.Errorf("message %d of stream %s, which holds tokens the slot replays, left the stream during the resume: the next session reads the stream again", seq, stream)
}
