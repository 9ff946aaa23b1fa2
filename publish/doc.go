// Package publish takes the batches batch cuts and puts them on NATS
// JetStream exactly once: it joins each batch's accounts (publish/join),
// signs its tokens (publish/token), encodes the message and its headers
// (publish/wire), and publishes it chained to the stream's last sequence,
// reporting a batch's positions as confirmable only once its PubAck came.
// It also owns the stream's identity (which database and incarnation it
// belongs to), the session markers that fence late publishes, and the
// read-back of what the stream holds on a restart.
//
// Data path, last step: after batch; it signs with publish/token, encodes
// with publish/wire, and sends to JetStream. Its core is publish/relay
// (with its simulation); beside it, the subscriber's room
// (publish/subscriber) reads what it wrote, importing none of it.
package publish
