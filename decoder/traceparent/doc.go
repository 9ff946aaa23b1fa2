// Package traceparent says which W3C traceparents the tailer carries: an
// application writes one into the transaction that inserts its tokens
// (decoder.TraceparentPrefix), the decoder keeps it for the tokens after
// it, the relay writes it into the message's headers, and a subscriber
// reads it back; each holds it to Valid, and passes anything else over.
//
// Data path, beside the decoder: standard library only, so that the
// subscriber's side reads the rule without the decoder.
package traceparent
