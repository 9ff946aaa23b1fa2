package daemon

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

func TestLagClock(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	type step struct {
		saw       pglogrepl.LSN // with at(sec)
		confirmed pglogrepl.LSN
		stream    int // confirmedAt(at(stream))
		sec       int
		// lag at at(now), in seconds; -1 for unknown
		now, want int
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"nothing known", []step{{now: 10, want: -1}}},
		{"seen, never confirmed: at least since then", []step{
			{saw: 0x100, sec: 1},
			{saw: 0x200, sec: 6},
			{now: 30, want: 29},
		}},
		{"confirmed positions give their times", []step{
			{saw: 0x100, sec: 1},
			{saw: 0x200, sec: 6},
			{saw: 0x300, sec: 11},
			{confirmed: 0x250},
			{now: 12, want: 6},
			{now: 42, want: 36}, // stuck: a second a second
			{confirmed: 0x300},
			{now: 43, want: 32},
		}},
		{"the stream's word counts", []step{
			{saw: 0x100, sec: 1},
			{confirmed: 0x100},
			{stream: 20},
			{now: 21, want: 1},
			{stream: 5}, // older: no step back
			{now: 22, want: 2},
		}},
		{"a position seen late lends its time to the one waiting", []step{
			{saw: 0x300, sec: 1},
			{saw: 0x200, sec: 4},
			{confirmed: 0x300},
			{now: 10, want: 6},
		}},
		{"the clock ahead of now reads zero", []step{
			{saw: 0x100, sec: 50},
			{confirmed: 0x100},
			{now: 40, want: 0},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c lagClock
			for i, s := range tc.steps {
				switch {
				case s.saw != 0:
					c.saw(s.saw, at(s.sec))
				case s.confirmed != 0:
					c.confirmed(s.confirmed)
				case s.stream != 0:
					c.confirmedAt(at(s.stream))
				default:
					lag, ok := c.lag(at(s.now))
					if got := int(lag / time.Second); !ok && s.want != -1 || ok && got != s.want {
						t.Fatalf("step %d: lag at %d = %v (known %v), want %d", i, s.now, lag, ok, s.want)
					}
				}
			}
		})
	}
}

// A stall longer than the positions kept thins them out instead of
// growing without bound, and still confirms to the newest.
func TestLagClockBounded(t *testing.T) {
	var c lagClock
	t0 := time.Unix(1_700_000_000, 0)
	for i := 1; i <= 3*maxPending; i++ {
		c.saw(pglogrepl.LSN(i*16), t0.Add(time.Duration(i)*time.Second))
	}
	if len(c.pending) > maxPending {
		t.Fatalf("%d positions kept", len(c.pending))
	}
	c.confirmed(pglogrepl.LSN(3 * maxPending * 16))
	if got := c.confirmedThrough(); !got.Equal(t0.Add(3 * maxPending * time.Second)) {
		t.Fatalf("confirmed through %v", got)
	}
}
