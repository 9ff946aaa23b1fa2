// Package wiretest reads a stream's messages back for tests, as the wire
// format (publish/wire) lays them out: the batches, their token ids and
// their token keys.
//
// Test support, beside publish/wire: production code never imports it.
package wiretest
