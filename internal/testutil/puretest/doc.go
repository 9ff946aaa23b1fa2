// Package puretest checks that a package is a pure core: no IO, no
// clock, no goroutine.
//
// Test support: TestPure of publish/relay and publish/subscriber/protocol.
package puretest
