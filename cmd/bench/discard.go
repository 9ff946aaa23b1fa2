package main

// The ceiling: a bare pglogrepl client that reads the slot's stream with the
// tailer's default pgoutput options and discards it, counting inserts.

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// discardDrain reads n inserts from slot and returns the tokens per second
// and the walsender's CPU per token (µs), from connecting to the n-th
// insert.
func discardDrain(ctx context.Context, url, slot string, n int) (Drain, error) {
	d := Drain{Variant: "discard-client", Tokens: n}
	start := time.Now()
	conn, err := startDiscard(ctx, url, slot)
	if err != nil {
		return d, err
	}
	defer conn.Close(context.Background())
	var walPID uint32 = conn.PID()
	steal := stealMeter()
	inserts := 0
	var pos pglogrepl.LSN
	for inserts < n {
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			return d, fmt.Errorf("discard client after %d inserts: %w", inserts, err)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok || len(cd.Data) == 0 {
			continue
		}
		switch cd.Data[0] {
		case pglogrepl.XLogDataByteID:
			x, err := pglogrepl.ParseXLogData(cd.Data[1:])
			if err != nil {
				return d, err
			}
			if len(x.WALData) > 0 && x.WALData[0] == 'I' {
				inserts++
			}
			pos = x.WALStart
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			k, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
			if err == nil && k.ReplyRequested {
				pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos, WALFlushPosition: 0, WALApplyPosition: 0})
			}
		}
	}
	d.Seconds = time.Since(start).Seconds()
	d.TokensPerSecond = float64(n) / d.Seconds
	walCPU, _ := cpuSeconds(int(walPID))
	d.WalsenderMicrosPerTk = 1e6 * walCPU / float64(n)
	d.WalsenderCPUPct = 100 * walCPU / d.Seconds
	d.StealPct = steal()
	return d, nil
}

// discardLive reads slot until ctx ends and calls arrived with the id of
// each token insert as it comes.
func discardLive(ctx context.Context, url, slot string, arrived func(id int64)) error {
	conn, err := startDiscard(ctx, url, slot)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	idColumn := map[uint32]int{}
	var pos pglogrepl.LSN
	inStream := false
	for {
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("discard client: %w", err)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok || len(cd.Data) == 0 {
			continue
		}
		switch cd.Data[0] {
		case pglogrepl.XLogDataByteID:
			x, err := pglogrepl.ParseXLogData(cd.Data[1:])
			if err != nil {
				return err
			}
			pos = x.WALStart
			m, err := pglogrepl.ParseV2(x.WALData, inStream)
			if err != nil {
				return fmt.Errorf("discard client: %w", err)
			}
			switch m := m.(type) {
			case *pglogrepl.StreamStartMessageV2:
				inStream = true
			case *pglogrepl.StreamStopMessageV2:
				inStream = false
			case *pglogrepl.RelationMessageV2:
				for i, c := range m.Columns {
					if c.Name == "id" {
						idColumn[m.RelationID] = i
					}
				}
			case *pglogrepl.InsertMessageV2:
				i, ok := idColumn[m.RelationID]
				if !ok || m.Tuple == nil || i >= len(m.Tuple.Columns) {
					continue
				}
				var id int64
				for _, b := range m.Tuple.Columns[i].Data {
					id = id<<8 | int64(b) // binary integer, big-endian, of any width
				}
				arrived(id)
			}
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			k, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
			if err == nil && k.ReplyRequested {
				pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos, WALFlushPosition: pos, WALApplyPosition: pos})
			}
		}
	}
}

// startDiscard opens a replication connection and starts streaming slot
// with the tailer's default pgoutput options.
func startDiscard(ctx context.Context, url, slot string) (*pgconn.PgConn, error) {
	conn, err := pgconn.Connect(ctx, url+"&replication=database")
	if err != nil {
		return nil, fmt.Errorf("discard client: %w", err)
	}
	err = pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '2'", "publication_names 'mailroom'", "binary 'true'", "streaming 'on'"},
	})
	if err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("discard client: %w", err)
	}
	return conn, nil
}
