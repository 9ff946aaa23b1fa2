// Package jsio is what both ends say to and hear from JetStream beside
// their own work: a message read back from the stream's leader (GetMsg),
// and the server's answers classified (a request unanswered, a leader
// not yet elected, a store without room for a message). The tailer's
// publisher (package publish), its subscriber (package subscriber) and the
// daemon's cause finder read the servers' words here, one way.
//
// Where it sits: beneath both rooms of publish (the relay's and the
// subscriber's), beside package wire (the formats), which does no IO.
package jsio
