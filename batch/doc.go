// Package batch cuts the stream of decoded tokens into batches by limit and
// timeout, and keeps the books of which WAL positions may be confirmed to
// the replication slot.
//
// Tokens are split into lanes (one, or one per action when each action has
// its own subject); every token gets a sequence number in commit order within
// its lane. A batch covers a contiguous range of one lane's numbers, and
// batches finish (are published or skipped) in order, so "everything up to
// sequence N of lane L is done" is one number per lane. WAL positions are
// recorded as marks (LSN, last sequence of each lane before it): a
// transaction's end LSN, or a keepalive's server position. A mark becomes
// confirmable once every lane is done up to it. Tokens that could not be
// decoded get no sequence number, so they never hold a mark back.
//
// Data path, third step: between decoder (token events) and publish
// (batches with their positions).
package batch
