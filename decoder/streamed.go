package decoder

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/mailroom/tailer/decoder/wal"
	"io"
	"os"

	"github.com/jackc/pglogrepl"

	"github.com/mailroom/tailer/decoder/action"
)

// memRows is how many rows of one streamed transaction stay in memory; the
// rest go to a temporary file. A streamed transaction is by definition one
// the server found too large for logical_decoding_work_mem, so it can hold
// millions of rows: kept whole in memory, 300,000 tokens cost 150 MB.
const memRows = 4096

// streamedTx buffers a streamed transaction's rows until Stream Commit:
// before it, the transaction may still abort. The first memRows rows are
// kept in memory, later ones are appended to a file that is unlinked as soon
// as it is created, so nothing is left behind by a crash.
type streamedTx struct {
	rows    []streamedRow
	file    *os.File
	w       *bufio.Writer
	spilled int
	// aborted holds the subtransactions rolled back so far; their rows are
	// dropped when the transaction is handed over.
	aborted map[uint32]struct{}
	// marks are the traceparents written into the transaction, in order.
	marks []traceMark
}

type streamedRow struct {
	subXid uint32
	tok    Token
	err    error
}

func (st *streamedTx) add(dir string, inMemory int, row *streamedRow) error {
	if len(st.rows) < inMemory {
		st.rows = append(st.rows, *row)
		return nil
	}
	if st.file == nil {
		f, err := os.CreateTemp(dir, "tailer-streamed-*")
		if err != nil {
			return fmt.Errorf("spill streamed transaction: %w", err)
		}
		os.Remove(f.Name())
		st.file, st.w = f, bufio.NewWriterSize(f, 64<<10)
	}
	if err := writeRow(st.w, row); err != nil {
		return fmt.Errorf("spill streamed transaction: %w", err)
	}
	st.spilled++
	return nil
}

func (st *streamedTx) close() {
	if st.file != nil {
		st.file.Close()
		st.file = nil
	}
}

// Spilled rows are fixed-size records for tokens, and a length-prefixed
// message for rows that could not be decoded.
const (
	recToken  = 'T'
	recBadRow = 'X'
	// tokenRecord is kind, subXid, ID, Account, Action, Secret, Code,
	// CodeLen, CodeNull.
	tokenRecord = 1 + 4 + 8 + 8 + 1 + 32 + action.MaxCodeLen + 1 + 1
)

func writeRow(w *bufio.Writer, row *streamedRow) error {
	var buf [tokenRecord]byte
	if row.err != nil {
		msg := row.err.Error()
		if len(msg) > 1<<16-1 {
			msg = msg[:1<<16-1]
		}
		b := append(buf[:0], recBadRow)
		b = binary.BigEndian.AppendUint32(b, row.subXid)
		b = binary.BigEndian.AppendUint16(b, uint16(len(msg)))
		if _, err := w.Write(b); err != nil {
			return err
		}
		_, err := w.WriteString(msg)
		return err
	}
	t := &row.tok
	b := append(buf[:0], recToken)
	b = binary.BigEndian.AppendUint32(b, row.subXid)
	b = binary.BigEndian.AppendUint64(b, uint64(t.ID))
	b = binary.BigEndian.AppendUint64(b, uint64(t.Account))
	b = append(b, byte(t.Action))
	b = append(b, t.Secret[:]...)
	b = append(b, t.Code[:]...)
	b = append(b, t.CodeLen, boolByte(t.CodeNull))
	_, err := w.Write(b)
	return err
}

func readRow(r *bufio.Reader, row *streamedRow) error {
	var buf [tokenRecord]byte
	if _, err := io.ReadFull(r, buf[:5]); err != nil {
		return err
	}
	row.subXid = binary.BigEndian.Uint32(buf[1:])
	switch buf[0] {
	case recBadRow:
		if _, err := io.ReadFull(r, buf[:2]); err != nil {
			return err
		}
		msg := make([]byte, binary.BigEndian.Uint16(buf[:2]))
		if _, err := io.ReadFull(r, msg); err != nil {
			return err
		}
		row.err = errors.New(string(msg))
		return nil
	case recToken:
		if _, err := io.ReadFull(r, buf[5:]); err != nil {
			return err
		}
		b := buf[5:]
		t := &row.tok
		*t = Token{}
		row.err = nil
		t.ID = int64(binary.BigEndian.Uint64(b))
		t.Account = int64(binary.BigEndian.Uint64(b[8:]))
		t.Action = action.Action(b[16])
		copy(t.Secret[:], b[17:49])
		b = b[49:]
		copy(t.Code[:], b[:action.MaxCodeLen])
		t.CodeLen, t.CodeNull = b[action.MaxCodeLen], b[action.MaxCodeLen+1] != 0
		return nil
	}
	return fmt.Errorf("spilled row of unknown kind %q", buf[0])
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// handover is a committed streamed transaction being handed to the sink.
type handover struct {
	tx         *streamedTx
	xid        uint32
	commitLSN  pglogrepl.LSN
	endLSN     pglogrepl.LSN
	commitTime int64
	// next is the next in-memory row; index the next position's index.
	next  int
	index uint32
	// added counts the rows read so far, aborted ones included; trace is
	// the traceparent the next row carries, mark the next traceMark.
	added int
	trace string
	mark  int
	r     *bufio.Reader
	left  int // spilled rows not read yet
	row   streamedRow
}

// Handing over reads rows back from the spill file.
func (h *handover) start() error {
	if h.tx.file == nil {
		return nil
	}
	if err := h.tx.w.Flush(); err != nil {
		return fmt.Errorf("spill streamed transaction: %w", err)
	}
	if _, err := h.tx.file.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("read back streamed transaction: %w", err)
	}
	h.r, h.left = bufio.NewReaderSize(h.tx.file, 64<<10), h.tx.spilled
	return nil
}

// step hands at most max rows to sink, and the commit after the last one.
// It reports whether the transaction is fully handed over.
func (h *handover) step(sink Output, max int) (bool, error) {
	for n := 0; n < max; n++ {
		var row *streamedRow
		switch {
		case h.next < len(h.tx.rows):
			row = &h.tx.rows[h.next]
			h.next++
		case h.left > 0:
			if err := readRow(h.r, &h.row); err != nil {
				return false, fmt.Errorf("read back streamed transaction: %w", err)
			}
			h.left--
			row = &h.row
		default:
			h.tx.close()
			sink.Commit(h.commitLSN, h.endLSN, pgTime(h.commitTime))
			return true, nil
		}
		for ; h.mark < len(h.tx.marks) && h.tx.marks[h.mark].at <= h.added; h.mark++ {
			if _, gone := h.tx.aborted[h.tx.marks[h.mark].subXid]; !gone {
				h.trace = h.tx.marks[h.mark].trace
			}
		}
		h.added++
		if _, gone := h.tx.aborted[row.subXid]; gone {
			continue
		}
		pos := wal.Position{Commit: wal.LSN(h.commitLSN), Index: h.index}
		h.index++
		if row.err != nil {
			sink.BadRow(pos, row.err)
			continue
		}
		row.tok.Pos, row.tok.Xid, row.tok.CommitTime, row.tok.Trace = pos, h.xid, h.commitTime, h.trace
		sink.Token(&row.tok)
	}
	return false, nil
}
