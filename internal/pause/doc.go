// Package pause waits short times, for the loops that poll for a state
// nothing can wake them on: a transaction becoming visible, a pipe's
// reader taking its bytes.
//
// Wiring: publish/join, publish/subscriber, the daemon's and the
// subscriber's health checks.
package pause
