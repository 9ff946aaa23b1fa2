// Package token is mailroom's token as a backend sees it: the format, its
// signing and verification with HMAC-SHA256, the keyring a tailer signs and
// a backend verifies with, and the token key (the per-token idempotency
// key consumers deduplicate on).
//
// A token is base64url(secret ‖ HMAC-SHA256(key, input)), 86 characters
// without padding, where input is its action's prefix ‖ secret, and its
// code after for an action that has one (decoder/action's table): byte for
// byte what mailroom signs.
//
// It imports the standard library and the action table only, so that a
// backend verifying a token from a link imports this and nothing else of
// the tailer.
//
// Where it sits: beneath both of publish's rooms; the relay signs with it,
// the subscriber's sinks and tailer verify read it.
package token
