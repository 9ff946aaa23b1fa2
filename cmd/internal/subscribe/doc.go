// Package subscribe runs what tailer subscribe drives: a sender command
// fed the lines on its standard input (Sender), and the subscriber's
// health and metrics endpoint (Serve).
//
// Wiring: what tailer subscribe drives around publish/subscriber.
package subscribe
