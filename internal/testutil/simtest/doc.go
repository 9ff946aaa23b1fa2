// Package simtest holds what the tests of the deterministic simulations
// share.
//
// Test support: the default seeds of TestSimulation in publish/relay
// and publish/subscriber/protocol, and of the subscriber's model tests.
package simtest
