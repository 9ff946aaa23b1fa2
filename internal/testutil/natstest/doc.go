// Package natstest starts the embedded NATS server for tests.
//
// Test support: the embedded nats-server (internal/embedded) a test
// starts and connects to, both ended with the test.
package natstest
