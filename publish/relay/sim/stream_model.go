package sim

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/mailroom/tailer/decoder/wal"
	"github.com/mailroom/tailer/publish/relay"
)

// The simulation's model of a JetStream stream: what the tailer relies on
// of it, and what its faults do. TestStreamModelAgreesWithJetStream holds
// it to a real server.

// msg is a message as the model stores it.
type msg struct {
	relay.Published
	id string
}

// mark is what wire.Mark makes of a message: its id's mark.
func (m msg) mark() string { return "id:" + m.id }

// errWrongLastSeq is JetStream's refusal of a publish whose expected last
// sequence is not the stream's; errFull, a stream whose max_msgs with
// discard new is reached ("maximum messages exceeded").
var (
	errWrongLastSeq = errors.New("wrong last sequence")
	errFull         = errors.New("maximum messages exceeded")
)

// streamModel is one stream: its messages, and what its replicas report.
type streamModel struct {
	name    string
	msgs    map[uint64]msg
	first   uint64
	last    uint64
	deleted int
	ids     map[string]uint64
	// maxMsgs > 0 limits the stream: it removes the oldest message for a
	// new one, or with discardNew refuses the new one.
	maxMsgs    int
	discardNew bool
	replicas   []string
	leader     int
	// made counts the streams made under the name, for creation times.
	made *int
}

// newStream makes a stream of name; maxMsgs > 0 limits it (discard old).
func newStream(name string, maxMsgs int, made *int) *streamModel {
	*made++
	s := &streamModel{name: name, msgs: map[uint64]msg{}, ids: map[string]uint64{}, maxMsgs: maxMsgs, made: made, first: 1}
	s.replicas = []string{fmt.Sprintf("t%d", *made)}
	return s
}

// seen is what the stream holds, as its info says (publish.SeenOf): a
// stream that never held a message has first sequence zero; its batches
// are the messages on the batches' subjects.
func (s *streamModel) seen() relay.Seen {
	first := s.first
	if s.last == 0 {
		first = 0
	}
	seen := relay.Seen{Known: true, First: first, Last: s.last, Deleted: s.deleted, Trims: s.trims()}
	if seen.Trims {
		seen.Keeps = uint64(s.maxMsgs)
	}
	for _, m := range s.msgs {
		if slices.Contains(laneSubjects[:], m.Subject) {
			seen.Batches++
		}
	}
	return seen
}

// trims reports whether the stream's configuration removes old messages
// (publish.Trims): a limit that discards the oldest.
func (s *streamModel) trims() bool { return s.maxMsgs > 0 && !s.discardNew }

// limit changes the stream's limit, as an edit of its configuration: a
// lower one that discards the oldest removes them at once.
func (s *streamModel) limit(maxMsgs int, discardNew bool) {
	s.maxMsgs, s.discardNew = maxMsgs, discardNew
	s.trim()
}

// trim removes the oldest messages past a limit that discards them.
func (s *streamModel) trim() {
	for s.trims() && len(s.msgs) > s.maxMsgs {
		s.remove(s.first)
		s.advanceFirst()
	}
}

// created is the creation time the leader reports.
func (s *streamModel) created() string { return s.replicas[s.leader] }

// publish stores m when the stream's last sequence is expect (or
// expect < 0: any), or reports the id stored already (dup: its
// sequence, nothing stored).
func (s *streamModel) publish(m msg, expect int64) (seq uint64, dup bool, err error) {
	// JetStream checks the expected last sequence first: a duplicate
	// chained to another sequence is refused, not answered.
	if expect >= 0 && uint64(expect) != s.last {
		return 0, false, errWrongLastSeq
	}
	if m.id != "" {
		if seq, ok := s.ids[m.id]; ok {
			return seq, true, nil
		}
	}
	if s.maxMsgs > 0 && s.discardNew && len(s.msgs) >= s.maxMsgs {
		return 0, false, errFull
	}
	s.last++
	m.Seq = s.last
	s.msgs[m.Seq] = m
	if m.id != "" {
		s.ids[m.id] = m.Seq
	}
	if s.first == 0 {
		s.first = m.Seq
	}
	s.trim()
	return m.Seq, false, nil
}

// remove takes the message at seq off. Its id stays in the duplicate
// window: a publish of it is answered with seq, the message gone
// (JetStream does so, TestStreamModelAgreesWithJetStream).
func (s *streamModel) remove(seq uint64) { delete(s.msgs, seq) }

// advanceFirst moves the first sequence past the messages gone from the
// front; deleted counts those gone within.
func (s *streamModel) advanceFirst() {
	for s.first <= s.last {
		if _, ok := s.msgs[s.first]; ok {
			break
		}
		s.first++
	}
	if len(s.msgs) == 0 {
		s.first = s.last + 1
	}
	s.deleted = int(s.last-s.first+1) - len(s.msgs)
	if s.first > s.last {
		s.deleted = 0
	}
}

// purge removes every message (of subject, when it is not "").
func (s *streamModel) purge(subject string) {
	for seq, m := range s.msgs {
		if subject == "" || m.Subject == subject {
			s.remove(seq)
		}
	}
	s.advanceFirst()
}

// deleteMsg removes the message at seq; false when there is none.
func (s *streamModel) deleteMsg(seq uint64) bool {
	if _, ok := s.msgs[seq]; !ok {
		return false
	}
	s.remove(seq)
	s.advanceFirst()
	return true
}

// at is the message at seq.
func (s *streamModel) at(seq uint64) (relay.Published, bool) {
	m, ok := s.msgs[seq]
	return m.Published, ok
}

// lastOn is the last message on subject.
func (s *streamModel) lastOn(subject string) (relay.Published, bool) {
	var best msg
	for _, m := range s.msgs {
		if m.Subject == subject && m.Seq > best.Seq {
			best = m
		}
	}
	return best.Published, best.Seq != 0
}

// mark is what wire.Mark makes of the message at seq.
func (s *streamModel) mark(seq uint64) (string, bool) {
	m, ok := s.msgs[seq]
	return m.mark(), ok
}

// restore makes the stream again from a backup: the messages up to seq
// (a snapshot of s taken then), under a new creation time.
func (s *streamModel) restore(backup *streamModel) *streamModel {
	r := newStream(s.name, s.maxMsgs, s.made)
	r.discardNew = s.discardNew
	for seq, m := range backup.msgs {
		r.msgs[seq] = m
		r.ids[m.id] = seq
	}
	r.first, r.last, r.deleted = backup.first, backup.last, backup.deleted
	return r
}

// clone is a backup of s.
func (s *streamModel) clone() *streamModel {
	c := *s
	c.msgs, c.ids = make(map[uint64]msg, len(s.msgs)), make(map[string]uint64, len(s.ids))
	for k, v := range s.msgs {
		c.msgs[k] = v
	}
	for k, v := range s.ids {
		c.ids[k] = v
	}
	c.replicas = append([]string(nil), s.replicas...)
	return &c
}

// replicate gives the stream replicas of their own creation times (a
// stream restored into a cluster: each replica reports its own).
func (s *streamModel) replicate() {
	*s.made++
	s.replicas = append(s.replicas, fmt.Sprintf("t%d", *s.made))
}

// keys counts the tokens the stream holds, by key.
func (s *streamModel) keys() map[string]int {
	n := map[string]int{}
	for _, m := range s.msgs {
		if m.Is != relay.Batch || m.Keys == "" {
			continue
		}
		for _, k := range strings.Split(m.Keys, ",") {
			n[k]++
		}
	}
	return n
}

// past reports whether the stream holds, after sequence after, a batch
// published from origin at a position past end.
func (s *streamModel) past(origin string, end wal.LSN, after uint64) bool {
	for seq, m := range s.msgs {
		if seq > after && m.Is == relay.Batch && m.Origin == origin && m.Last.Commit > end {
			return true
		}
	}
	return false
}

// seqs are the stream's sequences, in order.
func (s *streamModel) seqs() []uint64 {
	out := make([]uint64, 0, len(s.msgs))
	for seq := range s.msgs {
		out = append(out, seq)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// marks are the messages s holds, by sequence.
func (s *streamModel) marks() map[uint64]string {
	out := make(map[uint64]string, len(s.msgs))
	for seq, m := range s.msgs {
		out[seq] = m.mark()
	}
	return out
}

// reader reads s for Scan.
type modelReader struct{ s *streamModel }

func (r modelReader) At(seq uint64) (relay.Published, bool, error) {
	m, ok := r.s.at(seq)
	return m, ok, nil
}

func (r modelReader) LastOn(subject string) (relay.Published, bool, error) {
	m, ok := r.s.lastOn(subject)
	return m, ok, nil
}
