// Package action is what a decoded row's action means: the table of token
// actions (their labels, signing prefixes, code lengths and account
// statuses) and the width of the code column.
//
// Data path, beside the decoder that reads the action from each row: the
// batcher's lanes, the signer (publish/token), the subjects and the
// subscriber's filter all read this one table. Standard library only, so
// that a backend verifying a token with publish/token pulls in nothing
// more.
package action
