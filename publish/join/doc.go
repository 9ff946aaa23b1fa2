// Package join is the stage between cutting batches and publishing them: it
// joins a batch of tokens with the current state of their rows and
// accounts, and decides which tokens are still to be mailed.
//
// Data path, fourth step, beside publish: its pipeline calls it to fill a
// batch's tokens with their accounts before signing.
package join
