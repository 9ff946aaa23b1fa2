package publish

import (
	"github.com/jackc/pglogrepl"

	"github.com/mailroom/tailer/decoder/wal"
	"github.com/mailroom/tailer/publish/relay"
)

// OriginOf is the origin of a server: its system identifier, timeline and
// database, and where each of its earlier timelines ended (history, the
// server's timeline history).
func OriginOf(systemID string, timeline int32, database string, history map[int32]pglogrepl.LSN) relay.Origin {
	o := relay.Origin{SystemID: systemID, Timeline: timeline, Database: database, History: make(map[int32]wal.LSN, len(history))}
	for tl, end := range history {
		o.History[tl] = wal.LSN(end)
	}
	return o
}

// CheckOrigin refuses a stream whose last message was published from
// another database than here: another database of the server, a new
// cluster, a restore to a new cluster (a *relay.ForeignStreamError).
func (p *Publisher) CheckOrigin(here relay.Origin) error {
	return relay.CheckOrigin(p.name, p.last, here)
}
