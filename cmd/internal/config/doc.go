// Package config reads the tailer's MAILROOM_* settings from the
// environment and from the equivalent command-line flags (flags win), and
// validates them before anything connects.
//
// Wiring: reads the settings cmd/tailer hands to the data path.
package config
