// Package puretest checks that a package is a pure core: no IO, no
// clock, no goroutine.
//
// Test support: TestPure of publish/protocol and publish/consume/protocol.
package puretest
