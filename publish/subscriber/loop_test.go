package subscriber

import (
	"errors"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/wire"
)

// countMsg is a delivery of tokens tokens, by its Mailroom-Count.
type countMsg struct {
	jetstream.Msg
	tokens int
}

func (m countMsg) Headers() nats.Header {
	return nats.Header{wire.HeaderCount: []string{strconv.Itoa(m.tokens)}}
}

// heldIter is an iterator holding msgs, then err (nats.ErrTimeout: the
// wait for more ran out).
type heldIter struct {
	jetstream.MessagesContext
	msgs []jetstream.Msg
	err  error
}

func (it *heldIter) Next(...jetstream.NextOpt) (jetstream.Msg, error) {
	if len(it.msgs) == 0 {
		return nil, it.err
	}
	m := it.msgs[0]
	it.msgs = it.msgs[1:]
	return m, nil
}

// A group is the first message and those the iterator holds already, up
// to pull messages and groupTokens tokens: the message that reaches the
// bound is the group's last.
func TestGatherBounds(t *testing.T) {
	msgs := func(tokens ...int) []jetstream.Msg {
		var out []jetstream.Msg
		for _, n := range tokens {
			out = append(out, countMsg{tokens: n})
		}
		return out
	}
	down := errors.New("the connection closed")
	for _, tc := range []struct {
		name   string
		first  int
		held   []int
		pull   int
		err    error
		want   int
		wantEr error
	}{
		{"all held, under both bounds", 1, []int{1, 1}, 10, nats.ErrTimeout, 3, nil},
		{"pull messages at most", 1, []int{1, 1, 1, 1}, 3, nats.ErrTimeout, 3, nil},
		{"groupTokens reached exactly", groupTokens / 2, []int{groupTokens / 2, 1}, 10, nats.ErrTimeout, 2, nil},
		{"groupTokens passed", groupTokens - 1, []int{2, 1}, 10, nats.ErrTimeout, 2, nil},
		{"one message of more than groupTokens", groupTokens + 1, []int{1}, 10, nats.ErrTimeout, 1, nil},
		{"the iterator's error ends it", 1, []int{1}, 10, down, 2, down},
	} {
		it := &heldIter{msgs: msgs(tc.held...), err: tc.err}
		group, err := gather(it, countMsg{tokens: tc.first}, tc.pull)
		if len(group) != tc.want || !errors.Is(err, tc.wantEr) {
			t.Errorf("%s: a group of %d (%v), want %d (%v)", tc.name, len(group), err, tc.want, tc.wantEr)
		}
	}
}
