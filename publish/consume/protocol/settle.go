package protocol

// ReaderEnd is how a reader ended, as settling the batches it held needs
// it.
type ReaderEnd struct {
	// Done: it read to the end of its input and said it finished
	// everything; Failed: it failed with batches in hand.
	Done, Failed bool
	// Reports: it reports each line it finished, and only those are done.
	Reports bool
	// Pipe: it read from a pipe, of which it took Taken bytes; Ends are
	// where each batch handed to it ends in the pipe, oldest first.
	Pipe  bool
	Taken int64
	Ends  []int64
}

// Settle decides the batches a reader held as it ended: all of them done
// (it said it finished everything, and does not report line by line),
// and the one its failure counts against (-1: none), the oldest it took
// whole: a reader that keeps failing on one batch fails there first. A
// reader not fed through a pipe took each batch handed to it.
func Settle(e ReaderEnd) (allDone bool, blamed int) {
	if e.Done && !e.Reports {
		return true, -1
	}
	if !e.Failed {
		return false, -1
	}
	for i, end := range e.Ends {
		if end <= e.Taken || !e.Pipe {
			return false, i
		}
	}
	return false, -1
}
