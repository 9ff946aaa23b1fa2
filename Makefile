.PHONY: build test demo bench

build:
	go build -o bin/tailer ./cmd/tailer

# The test command: formatting, vet, and every test with the race detector
# against a real PostgreSQL and embedded NATS.
test:
	@unformatted=$$(gofmt -l .); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	go vet ./...
	go test -race -count=1 -timeout 20m ./...

# Runs the whole thing end to end on a throwaway PostgreSQL.
demo:
	./scripts/demo.sh

# Drain rate, CPU, growth, live latency and memory against a throwaway
# PostgreSQL and embedded JetStream; prints a table, writes bench-results.json.
bench:
	go run ./cmd/bench
