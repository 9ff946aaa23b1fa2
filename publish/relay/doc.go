// Package relay is the relay's protocol, the decisions of tailer run
// that keep "every token on the stream once, or a refusal that lasts":
// whether a slot and a stream may be streamed from, what a restart may
// skip, and when the operator must act. It is a pure core in the shape of
// etcd's raft library: a Relay takes events (what the session found: the
// slot's record, the stream's state, a check's result, how a session
// ended) and returns commands (make the slot, bind the stream, resume,
// refuse with a fact, record a refusal that lasts, retry after a delay).
// It starts no goroutine, reads no clock and does no IO; the daemon
// (cmd/internal/daemon) carries events in and commands out, and a
// deterministic simulation (publish/relay/sim) drives it against models of the
// slot and of JetStream.
//
// What the session replays is decided here too: Scan finds the window of
// messages that hold tokens the slot replays (reading the stream through
// a Reader the caller owns), and Window says, token by token, which of
// them the stream holds.
//
// Where it sits: the relay's room of publish, beside the subscriber's
// (publish/subscriber); its simulation is publish/relay/sim. publish reads
// the stream with Scan and Window; the daemon steps the Relay.
package relay
