// Package wire is the tailer's message format as both ends see it: the
// header names of a published batch and of a session marker, the body
// formats and the rule for what may go into a collector line. The producer
// (package publish) writes it and consumers (package subscriber) read it;
// neither owns it. The token itself, and its key, are package token's;
// reading a message back from the servers is package jsio's.
//
// It depends on the standard library only and does no IO, so that the
// subscriber's core (package subscriber/protocol) may hold its anchors and
// chains.
//
// Where it sits: beneath both rooms of publish, the relay's (package
// publish and publish/relay write it) and the subscriber's
// (publish/subscriber reads it); it imports only decoder/action.
package wire
