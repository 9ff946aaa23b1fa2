// Command bench measures the tailer the way its users judge it, against a
// throwaway PostgreSQL and an embedded JetStream server it starts itself:
// backlog drain rate and CPU (tailer and walsender), drain rate as the
// backlog grows, live commit-to-delivery latency, and memory. It prints a
// table and writes the figures as JSON.
//
//	go run ./cmd/bench [-tokens 200000] [-big 1000000] [-out bench-results.json]
//
// Beside the data path: it runs the tailer binary against a throwaway
// PostgreSQL and embedded NATS and measures it (docs/performance.md).
package main
