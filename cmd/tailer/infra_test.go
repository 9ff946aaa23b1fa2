package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.yaml.in/yaml/v3"
	"golang.org/x/crypto/bcrypt"

	"github.com/mailroom/tailer/cmd/internal/daemon"
	"github.com/mailroom/tailer/cmd/internal/natsconn"
	"github.com/mailroom/tailer/cmd/internal/natsmetrics"
	"github.com/mailroom/tailer/cmd/internal/subscribe"
	"github.com/mailroom/tailer/internal/embedded"
	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
	"github.com/mailroom/tailer/migrations/migratetest"
)

const infra = "../../infra/"

type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Entrypoint  []string          `yaml:"entrypoint"`
		Profiles    []string          `yaml:"profiles"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Volumes     []string          `yaml:"volumes"`
		Ports       []string          `yaml:"ports"`
		Restart     string            `yaml:"restart"`
		Healthcheck struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
		DependsOn map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
	} `yaml:"services"`
}

func readCompose(t *testing.T, path string) composeFile {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

func TestComposeFile(t *testing.T) {
	c := readCompose(t, infra+"docker-compose.yml")
	for _, name := range []string{"postgres", "nats", "migrate", "tailer", "postgres-exporter", "nats-exporter", "prometheus", "alertmanager", "grafana", "subscriber", "nats-cli"} {
		if _, ok := c.Services[name]; !ok {
			t.Errorf("service %s missing", name)
		}
	}
	pg := strings.Join(c.Services["postgres"].Command, " ")
	for _, want := range []string{"wal_level=logical", "max_slot_wal_keep_size="} {
		if !strings.Contains(pg, want) {
			t.Errorf("postgres command %q lacks %s", pg, want)
		}
	}
	if n := c.Services["nats"]; !slices.Contains(n.Command, "--config") || !slices.Contains(n.Volumes, "natsdata:/data") {
		t.Errorf("nats service: command %v, volumes %v; want nats/nats.conf and JetStream on a volume", n.Command, n.Volumes)
	}
	if got := c.Services["postgres"].Healthcheck.Test; !strings.Contains(strings.Join(got, " "), "pg_isready -h 127.0.0.1") {
		t.Errorf("postgres healthcheck %v must check over TCP: the init scripts' temporary server only listens on the socket", got)
	}
	if r := c.Services["migrate"].Restart; r != "on-failure" {
		t.Errorf("migrate restart %q: a slow first start of PostgreSQL must not leave the stack without its schema", r)
	}
	if got := c.Services["tailer"].Healthcheck.Test; !slices.Equal(got, []string{"CMD", "/usr/local/bin/tailer", "health"}) {
		t.Errorf("tailer healthcheck %v, want tailer health", got)
	}
	if g := c.Services["grafana"].Environment; g["GF_AUTH_ANONYMOUS_ENABLED"] != "false" || g["GF_SECURITY_ADMIN_PASSWORD__FILE"] != "/run/secrets/grafana_admin_password" {
		t.Errorf("grafana: anonymous access and an admin password: %v", g)
	}
	if got := c.Services["migrate"].Command; !slices.Equal(got, []string{"migrate"}) {
		t.Errorf("migrate command = %v", got)
	}
	tailer := c.Services["tailer"]
	if tailer.DependsOn["migrate"].Condition != "service_completed_successfully" || tailer.DependsOn["nats"].Condition != "service_healthy" {
		t.Errorf("tailer must start after migrate completes and NATS is healthy: %+v", tailer.DependsOn)
	}
	// The operator's CLI logs in as admin or system from their secrets,
	// and is never started by up.
	if cli := c.Services["nats-cli"]; !slices.Contains(cli.Profiles, "tools") || cli.Environment["NATS_URL"] == "" {
		t.Errorf("nats-cli: behind the tools profile, pointed at nats: %+v", cli)
	}
	if _, ok := c.Services["prometheus"].DependsOn["tailer"]; ok {
		t.Error("prometheus waits for the tailer: it must run to report that the tailer does not")
	}
	// The daemon and the migration run as different roles, and no
	// password is pasted into a URL (a generated one may hold '/' or '@').
	for name, role := range map[string]string{"tailer": "tailer", "migrate": "mailroom_owner"} {
		env := c.Services[name].Environment
		if u := env["MAILROOM_DATABASE_URL"]; !strings.HasPrefix(u, "postgres://"+role+"@") || strings.Contains(u, "$") {
			t.Errorf("%s: MAILROOM_DATABASE_URL %q: want role %s and no password in it", name, u, role)
		}
		if !strings.HasPrefix(env["MAILROOM_DATABASE_PASSWORD_FILE"], "/run/secrets/") || env["MAILROOM_DATABASE_PASSWORD"] != "" {
			t.Errorf("%s: the database password must come from a secret's file (MAILROOM_DATABASE_PASSWORD_FILE)", name)
		}
	}
	if e := c.Services["postgres-exporter"].Environment; !strings.HasPrefix(e["DATA_SOURCE_NAME"], "postgresql://postgres_exporter@") || e["EXPORTER_DB_PASSWORD_FILE"] != "/run/secrets/exporter_db_password" || e["DATA_SOURCE_PASS"] != "" {
		t.Errorf("postgres-exporter: its own role, the password apart from the URL: %v", e)
	}
	if tailer.Environment["MAILROOM_SECRET_KEY"] != "" || tailer.Environment["MAILROOM_SECRET_KEY_FILE"] != "" || tailer.Environment["MAILROOM_KEYRING_FILE"] != "/run/secrets/mailroom_keyring" {
		t.Error("the signing keys must come from the keyring secret, not the compose file")
	}
	if tailer.Environment["MAILROOM_NATS_URL"] == "" {
		t.Error("the tailer must use the nats service, not its embedded server")
	}
	sub := c.Services["subscriber"]
	if !slices.Contains(sub.Profiles, "subscriber") || sub.Environment["MAILROOM_NATS_USER"] != "subscriber" ||
		sub.Environment["MAILROOM_NATS_PASSWORD_FILE"] != "/run/secrets/nats_subscriber_password" || !slices.Contains(sub.Command, "--exec") {
		t.Errorf("subscriber: behind a profile, as the subscriber user, feeding a sender: %+v", sub)
	}
	for _, arg := range sub.Command {
		if strings.Contains(arg, "PASSWORD") || strings.Contains(arg, "${") {
			t.Errorf("subscriber: %q on the command line", arg)
		}
	}

	cluster := readCompose(t, infra+"docker-compose.cluster.yml")
	for path, f := range map[string]composeFile{"docker-compose.yml": c, "docker-compose.cluster.yml": cluster} {
		for name, s := range f.Services {
			// Every port on loopback only.
			for _, p := range s.Ports {
				if !strings.HasPrefix(p, "127.0.0.1:") {
					t.Errorf("%s: %s publishes %q on every interface", path, name, p)
				}
			}
			if s.Image == "" {
				continue // an override of the stack's service
			}
			// The server version the tests embed (see the nats service).
			if strings.HasPrefix(s.Image, "nats:") && s.Image != "nats:"+server.VERSION+"-alpine" {
				t.Errorf("%s: %s runs %s; the tests embed nats-server %s", path, name, s.Image, server.VERSION)
			}
			if strings.HasPrefix(s.Image, "nats:") && name != "nats-volume" && (!slices.Contains(s.Command, "--config") || !slices.Contains(s.Entrypoint, "/etc/nats/entrypoint.sh")) {
				t.Errorf("%s: %s runs without nats/nats.conf and its entrypoint: anonymous access, or passwords read as configuration", path, name)
			}
			// Health where the image allows one; migrate, nats-volume and
			// nats-auth run once, nats-cli once per command.
			once := name == "migrate" || name == "nats-volume" || name == "nats-auth" || name == "nats-cli"
			if !once && len(s.Healthcheck.Test) == 0 {
				t.Errorf("%s: %s has no healthcheck", path, name)
			}
			if !once && s.Restart != "unless-stopped" {
				t.Errorf("%s: %s restart %q, want unless-stopped", path, name, s.Restart)
			}
		}
		raw, err := os.ReadFile(infra + path)
		if err != nil {
			t.Fatal(err)
		}
		// A password from the environment is in docker inspect for good;
		// each comes from a secret's file (scripts/compose-config.sh checks
		// the resolved stack).
		if m := regexp.MustCompile(`\$\{[A-Z_]*(PASSWORD|SECRET|KEY|TOKEN)[A-Z_]*[:}]`).Find(raw); m != nil {
			t.Errorf("%s: %s puts a secret in a container's environment", path, m)
		}
	}
	conf, err := os.ReadFile(infra + "nats/nats.conf")
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"no_auth_user", "authorization"} {
		if strings.Contains(string(conf), bad) {
			t.Errorf("nats/nats.conf uses %s: every client must log in as one of the account's users", bad)
		}
	}
	ignore, err := os.ReadFile("../../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{".git", "infra/secrets", "infra/.env"} {
		if !slices.Contains(strings.Split(string(ignore), "\n"), want) {
			t.Errorf(".dockerignore lacks %s: it would go into the build context", want)
		}
	}
	// The cluster file turns the stack's nats into the first of three
	// nodes on the stack's network, routed with the route password
	// (TestNATSClusterRoutes runs cluster.conf), and the tailer's stream
	// into R3. The cluster-TLS file puts the nodes' routes and clients on
	// TLS.
	clusterTLS := readCompose(t, infra+"docker-compose.cluster-tls.yml")
	for _, name := range []string{"nats", "nats-2", "nats-3"} {
		s := cluster.Services[name]
		if cmd := strings.Join(s.Command, " "); !strings.HasPrefix(cmd, "nats-server --config /etc/nats/cluster.conf --server_name ") ||
			s.Environment["NATS_ROUTE_PASSWORD_FILE"] != "/run/secrets/nats_route_password" || s.Environment["NATS_ROUTE_HOSTS"] != "nats nats-2 nats-3" {
			t.Errorf("cluster node %s: %s, environment %v", name, cmd, s.Environment)
		}
		s = clusterTLS.Services[name]
		if cmd := strings.Join(s.Command, " "); !strings.HasPrefix(cmd, "nats-server --config /etc/nats/cluster-tls.conf --server_name ") || s.Environment["NATS_TLS_CERT_FILE"] == "" {
			t.Errorf("cluster-TLS node %s: %s, environment %v", name, cmd, s.Environment)
		}
	}
	if env := cluster.Services["tailer"].Environment; env["MAILROOM_NATS_REPLICAS"] != "3" || strings.Count(env["MAILROOM_NATS_URL"], "nats://") != 3 {
		t.Errorf("cluster file: the tailer must create an R3 stream and know every node: %v", env)
	}
	// nats-1 must not see the single server's JetStream: it would delete
	// its streams as orphans.
	if v := cluster.Services["nats"].Volumes; !slices.Contains(v, "nats1:/data") || slices.ContainsFunc(v, func(m string) bool { return strings.HasPrefix(m, "natsdata:") }) {
		t.Errorf("cluster file: nats-1's JetStream on %v, want a volume of its own (nats1:/data)", v)
	}
	if len(cluster.Services) != 8 {
		t.Errorf("cluster file has services %v", slices.Collect(maps.Keys(cluster.Services)))
	}

	// The TLS file: every PostgreSQL client verifies the server's name
	// against the stack's CA, every NATS client has the CA, and NATS
	// takes clients over TLS only.
	tls := readCompose(t, infra+"docker-compose.tls.yml")
	for _, name := range []string{"migrate", "tailer"} {
		if u := tls.Services[name].Environment["MAILROOM_DATABASE_URL"]; !strings.Contains(u, "sslmode=verify-full") || !strings.Contains(u, "sslrootcert=/run/secrets/tls_ca") {
			t.Errorf("TLS file: %s connects with %q, want sslmode=verify-full against the stack's CA", name, u)
		}
	}
	if u := tls.Services["postgres-exporter"].Environment["DATA_SOURCE_NAME"]; !strings.Contains(u, "sslmode=verify-full") {
		t.Errorf("TLS file: postgres-exporter connects with %q", u)
	}
	for _, name := range []string{"tailer", "subscriber"} {
		if tls.Services[name].Environment["MAILROOM_NATS_TLS_CA"] != "/run/secrets/tls_ca" {
			t.Errorf("TLS file: %s does not check NATS's certificate", name)
		}
	}
	if tls.Services["nats"].Environment["NATS_TLS_CERT_FILE"] == "" {
		t.Error("TLS file: NATS without its certificate")
	}

	docker, err := os.ReadFile(infra + "Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	d := string(docker)
	if strings.Count(d, "\nFROM ") != 3 || !strings.Contains(d, "CGO_ENABLED=0") || !strings.Contains(d, "USER nonroot") || !strings.HasSuffix(strings.TrimSpace(d[strings.LastIndex(d, "\nFROM "):]), `CMD ["run"]`) {
		t.Errorf("Dockerfile must be multi-stage, static and non-root, the tailer's stage last (the default target):\n%s", d)
	}
}

// The tailer's metric families, and postgres_exporter's.
var metricRe = regexp.MustCompile(`\b(tailer|pg|mailroom_subscriber|nats)_[a-z_]+`)

// referencedMetrics returns the tailer's and postgres_exporter's metric
// families named in the alert rules and the dashboard.
func referencedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	refs := map[string][]string{}
	add := func(where, expr string) {
		for _, m := range metricRe.FindAllString(expr, -1) {
			refs[m] = append(refs[m], where)
		}
	}
	data, err := os.ReadFile(infra + "prometheus/rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &rules); err != nil {
		t.Fatal(err)
	}
	alerts := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts++
			add("rule "+r.Alert, r.Expr)
		}
	}
	for _, want := range []string{"TailerSlotLagHigh", "TailerNotReady", "TailerStalled", "TailerDown", "PostgresSlotLagHigh", "PostgresSlotRetainingWAL", "PostgresSlotLost", "PostgresSlotMissing", "PostgresSlotInactive"} {
		if !strings.Contains(string(data), "alert: "+want) {
			t.Errorf("alert %s missing", want)
		}
	}
	data, err = os.ReadFile(infra + "grafana/dashboards/tailer.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("dashboard is not valid JSON: %v", err)
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			add("panel "+p.Title, tg.Expr)
		}
	}
	if alerts < 3 || len(dash.Panels) < 5 || len(refs) < 8 {
		t.Fatalf("%d alerts, %d panels, %d metrics referenced: too few to mean anything", alerts, len(dash.Panels), len(refs))
	}
	return refs
}

// histogramFamily is the family a histogram's series (name_bucket, _sum,
// _count) belongs to, or "".
func histogramFamily(series string) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(series, suffix); ok {
			return base
		}
	}
	return ""
}

// metricFamilies reads the families a /metrics page declares.
func metricFamilies(page string) map[string]bool {
	families := map[string]bool{}
	for _, line := range strings.Split(page, "\n") {
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			families[strings.Fields(rest)[0]] = true
		}
	}
	return families
}

// awaitMetrics polls a /metrics page until it holds want.
func awaitMetrics(t *testing.T, url string, want ...string) string {
	t.Helper()
	var body string
	tailertest.Eventually(t, 30*time.Second, func() error {
		var code int
		if code, body = httpGet(url); code != 200 || slices.ContainsFunc(want, func(w string) bool { return !strings.Contains(body, w) }) {
			return fmt.Errorf("%s never held %q: %d\n%s", url, want, code, body)
		}
		return nil
	})
	return body
}

// Every metric the alert rules and the dashboard name is exported: the
// tailer's by the tailer, the PostgreSQL side's by postgres_exporter, run
// as the compose file runs it (its own role, pg_monitor only).
func TestDashboardAndRulesUseExportedMetrics(t *testing.T) {
	t.Parallel()
	refs := referencedMetrics(t)
	s := startComposeDB(t, "max_slot_wal_keep_size=1GB")
	c := s.cluster(t)
	port, _ := pgtest.FreePort()
	p := c.tailer(append(s.tailerEnv(t), "MAILROOM_HTTP_ADDR=127.0.0.1:"+strconv.Itoa(port), "MAILROOM_LAG_INTERVAL=100")...)
	p.waitLog("msg=streaming", 1, 30*time.Second)
	exported := metricFamilies(awaitMetrics(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", port), "tailer_slot_lag_bytes "))
	check := func(prefix string) int {
		n := 0
		for name, where := range refs {
			if !strings.HasPrefix(name, prefix) {
				continue
			}
			n++
			if !exported[name] && !exported[histogramFamily(name)] {
				t.Errorf("%s (used by %s) is not exported", name, strings.Join(where, ", "))
			}
		}
		return n
	}
	check("tailer_")
	for _, name := range daemon.MetricNames {
		if !exported[name] {
			t.Errorf("%s is in MetricNames but not exported", name)
		}
	}
	// A subscriber's endpoint: every family the dashboard row and the
	// subscriber alerts use.
	sport, _ := pgtest.FreePort()
	saddr := fmt.Sprintf("127.0.0.1:%d", sport)
	c.execSubscriber(t, "metrics", "cat > /dev/null", "--health-addr", saddr)
	maps.Copy(exported, metricFamilies(awaitMetrics(t, "http://"+saddr+"/metrics", "mailroom_subscriber_pending_messages{")))
	if n := check("mailroom_subscriber_"); n < 5 {
		t.Errorf("only %d subscriber metrics referenced: the subscribers are not watched", n)
	}
	for _, name := range subscribe.MetricNames {
		if !exported[name] {
			t.Errorf("%s is in subscribe.MetricNames but not exported", name)
		}
	}
	// tailer nats-metrics: its families (package natsmetrics's tests
	// scrape each from real servers).
	for _, name := range natsmetrics.MetricNames {
		exported[name] = true
	}
	if n := check("nats_"); n < 5 {
		t.Errorf("only %d NATS metrics referenced: the servers are not watched", n)
	}
	// The slot active (the tailer streams): every series is there.
	exporter := s.exporter(t)
	// The tailer has recorded how far its slot is confirmed: the lag in
	// seconds from PostgreSQL's side (a custom query, pg_monitor's grant).
	maps.Copy(exported, metricFamilies(awaitMetrics(t, exporter, `pg_replication_slot_slot_confirmed_flush_lsn{slot_name="mailroom"`, `pg_mailroom_slot_lag_seconds{`)))
	if n := check("pg_"); n < 5 {
		t.Errorf("only %d postgres_exporter metrics referenced: the PostgreSQL side is not watched", n)
	}
}

// promtoolPath is promtool's path; without it the test is skipped, but
// in CI, which installs it.
func promtoolPath(t *testing.T) string {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool is missing: .ci/run installs it from Debian's prometheus package")
		}
		t.Skip("promtool not installed (apt-get install prometheus); CI runs this check")
	}
	return promtool
}

func TestPromtoolCheckRules(t *testing.T) {
	t.Parallel()
	promtool := promtoolPath(t)
	out, err := exec.Command(promtool, "check", "rules", infra+"prometheus/rules.yml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	out, err = exec.Command(promtool, "check", "config", "--syntax-only", infra+"prometheus/prometheus.yml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
	// Each alert with series that fire it and series that do not.
	out, err = exec.Command(promtool, "test", "rules", infra+"prometheus/rules_test.yml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	tested, err := os.ReadFile(infra + "prometheus/rules_test.yml")
	if err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile(infra + "prometheus/rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`- alert: (\w+)`).FindAllStringSubmatch(string(rules), -1) {
		if n := strings.Count(string(tested), "alertname: "+m[1]+"\n") + strings.Count(string(tested), "alertname: "+m[1]+"}"); n < 2 {
			t.Errorf("alert %s is evaluated %d times in rules_test.yml: want series that fire it and series that do not", m[1], n)
		}
	}
}

// The compose file runs the daemon as a role with only REPLICATION and the
// SELECTs migration 000003 grants; this checks that is enough.
func TestRunsAsRestrictedRole(t *testing.T) {
	t.Parallel()
	pg := pgtest.Shared(t)
	ctx := t.Context()
	admin, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `DO $$ BEGIN CREATE ROLE tailer LOGIN REPLICATION; EXCEPTION WHEN duplicate_object THEN NULL; END $$`); err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, pg, 5, 100*time.Millisecond)
	restricted := strings.Replace(c.URL, "postgres://postgres@", "postgres://tailer@", 1)
	var privileged bool
	if err := c.Conn.QueryRow(ctx, `SELECT rolsuper OR rolcreatedb FROM pg_roles WHERE rolname = 'tailer'`).Scan(&privileged); err != nil || privileged {
		t.Fatalf("role tailer: privileged=%v, %v", privileged, err)
	}
	p := c.tailer("MAILROOM_DATABASE_URL=" + restricted)
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'role' || g || '@x', 'role' || g FROM generate_series(1, 12) g`)
	if n := c.expectExactlyOnce(30 * time.Second); n != 12 {
		t.Fatalf("%d tokens", n)
	}
	if strings.Contains(p.out.String(), "permission denied") {
		t.Fatalf("permission errors:\n%s", p.out.String())
	}
}

// startNATSConfig runs a real NATS server with a configuration file, on a
// free loopback port with its store in a temporary directory, and points
// the cluster at it.
func (c *cluster) startNATSConfig(path string) {
	c.t.Helper()
	c.startNATSConfigIn(path, c.t.TempDir())
}

// startNATSConfigIn is startNATSConfig with its store in store (a restart
// on the same store).
func (c *cluster) startNATSConfigIn(path, store string) {
	c.t.Helper()
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		c.t.Fatal(err)
	}
	c.stopNATS()
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", c.natsPort, 0
	opts.StoreDir, opts.NoSigs, opts.NoLog = store, true, true
	s, err := server.NewServer(opts)
	if err != nil {
		c.t.Fatal(err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		c.t.Fatal("NATS with " + path + " not ready")
	}
	c.nats = s
}

// The compose stack's NATS configuration, run for real: no anonymous
// access; the tailer's user publishes, resyncs and reads status; the
// subscriber's user consumes with tailer subscribe but can neither publish
// batches nor purge or delete the stream.
func TestComposeNATSAccounts(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(20, uint64(time.Now().UnixNano())))
	tailerPW, subscriberPW, adminPW, systemPW := hostilePassword(rng), hostilePassword(rng), hostilePassword(rng), hostilePassword(rng)
	// The server gets bcrypt hashes, as nats-auth.sh makes them.
	conf := natsConfig(t, infra+"nats/nats.conf", map[string]string{"TAILER": bcryptOf(t, tailerPW), "SUBSCRIBER": bcryptOf(t, subscriberPW),
		"ADMIN": bcryptOf(t, adminPW), "SYSTEM": bcryptOf(t, systemPW)})
	c := newCluster(t, pgtest.Shared(t), 10, 100*time.Millisecond)
	c.startNATSConfig(conf)
	if nc, err := nats.Connect(c.natsURL()); err == nil {
		nc.Close()
		t.Fatal("anonymous connection accepted")
	}
	asTailer := []string{"MAILROOM_NATS_USER=tailer", "MAILROOM_NATS_PASSWORD=" + tailerPW}
	p := c.tailer(asTailer...)
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'acl' || g || '@x', 'acl' || g FROM generate_series(1, 20) g`)

	out := filepath.Join(t.TempDir(), "out")
	healthPort, _ := pgtest.FreePort()
	healthAddr := "127.0.0.1:" + strconv.Itoa(healthPort)
	sub := c.subscriber(out, "--durable", "sender", "--from-start", "--health-addr", healthAddr, "--nats-user", "subscriber", "--nats-password", subscriberPW)
	tailertest.Eventually(t, 30*time.Second, func() error {
		if tokens, _ := outputTokens(t, out); len(tokens) != 20 {
			return fmt.Errorf("subscriber wrote %d of 20 tokens:\n%s\ntailer:\n%s", len(tokens), sub.out.String(), p.out.String())
		}
		return nil
	})

	if code, body := subscriberHealth(healthAddr); code != exitOK || !strings.Contains(body, "ready: active (pinned), consumer sender") {
		t.Fatalf("tailer health of the subscriber: exit %d: %s", code, body)
	}
	// Started again, it reads back from the stream the message its record
	// saw last (the compose stack's subscriber lacked the right: it
	// waited on a request the server dropped).
	if code := sub.term(30 * time.Second); code != exitOK {
		t.Fatalf("subscriber exit %d:\n%s", code, sub.out.String())
	}
	sub = c.subscriber(out, "--durable", "sender", "--health-addr", healthAddr, "--nats-user", "subscriber", "--nats-password", subscriberPW)
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'acl2_' || g || '@x', 'acl2_' || g FROM generate_series(1, 5) g`)
	tailertest.Eventually(t, 20*time.Second, func() error {
		if tokens, _ := outputTokens(t, out); len(tokens) != 25 {
			return fmt.Errorf("subscriber started again wrote %d of 25 tokens:\n%s", len(tokens), sub.out.String())
		}
		return nil
	})
	// The dead-letter commands, as the subscriber's user.
	asSubscriber := []string{"MAILROOM_NATS_USER=subscriber", "MAILROOM_NATS_PASSWORD=" + subscriberPW}
	for _, args := range [][]string{{"dead-letters", "list", "--durable", "sender"}, {"dead-letters", "resend", "--durable", "sender"}} {
		if r := c.command(args, asSubscriber...); r.exit(30*time.Second) != exitOK {
			t.Fatalf("tailer %s as the subscriber's user:\n%s", strings.Join(args, " "), r.out.String())
		}
	}
	// The refusals below are the point: no need to print them.
	_, js := c.connectAs(t, "subscriber", subscriberPW, func(error) {})
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "MAILROOM")
	if err != nil {
		t.Fatalf("subscriber cannot look up the stream: %v", err)
	}
	for what, f := range map[string]func(context.Context) error{
		"purge":  func(ctx context.Context) error { return s.Purge(ctx) },
		"delete": func(ctx context.Context) error { return js.DeleteStream(ctx, "MAILROOM") },
		"publish": func(ctx context.Context) error {
			_, err := js.Publish(ctx, "mailroom.batches", []byte("forged"))
			return err
		},
	} {
		ctx, cancel := context.WithTimeout(c.ctx, 2*time.Second)
		if err := f(ctx); err == nil {
			t.Errorf("the subscriber's user may %s", what)
		}
		cancel()
	}
	checkOperatorUsers(t, c, tailerPW, adminPW, systemPW)
	checkTailerLeavesConsumers(t, c, tailerPW, "sender")

	if code := p.term(15 * time.Second); code != 0 {
		t.Fatalf("tailer exit %d", code)
	}
	r := c.command([]string{"resync"}, asTailer...)
	if code := r.exit(30 * time.Second); code != exitOK || !strings.Contains(r.out.String(), "already_on_stream=25 published=0") {
		t.Fatalf("resync as the tailer's user: exit %d:\n%s", code, r.out.String())
	}
	for _, bad := range [][]string{nil, {"MAILROOM_NATS_USER=tailer", "MAILROOM_NATS_PASSWORD=wrong-pw"}} {
		p := c.tailer(bad...)
		if code := p.exit(30 * time.Second); code != exitConfig || strings.Count(p.out.String(), "\n") != 1 || strings.Contains(p.out.String(), "wrong-pw") {
			t.Fatalf("tailer with credentials %v: exit %d, want %d and one line without the password:\n%s", bad, code, exitConfig, p.out.String())
		}
	}
	// Without NATS the subscriber is alive but not ready.
	c.stopNATS()
	if code, body := subscriberHealth(healthAddr); code != exitFailure || !strings.Contains(body, "not ready") {
		t.Fatalf("tailer health of the subscriber without NATS: exit %d: %s", code, body)
	}
	if out := sub.out.String(); strings.Contains(out, subscriberPW) || strings.Contains(out, tailerPW) {
		t.Fatalf("a password in the subscriber's output:\n%s", out)
	}
}

// subscriberHealth runs tailer health against a subscriber's --health-addr.
func subscriberHealth(addr string) (int, string) {
	cmd := exec.Command(tailerBin, "health", "--http-addr", addr)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), string(out)
	}
	return exitOK, string(out)
}

// bcryptOf is pw hashed with bcrypt, as nats-auth.sh's tailer nats-passwd
// hashes it: the form the compose stack's servers get. At the least cost,
// not its 11: the server here runs in the test's process under the race
// detector, and checks the hash at every connection
// (TestNATSPasswdHash checks the command's own).
func bcryptOf(t *testing.T, pw string) string {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}

// tailer nats-passwd, as nats-auth.sh runs it (the password file on
// stdin, its line end taken off as every _FILE setting's), prints the
// bcrypt hash, at cost 11, of the password the clients give from that
// file: a URL-hostile one matches, another does not; a short one is
// refused in one line, exit 2, not repeated. (That a server takes such a
// hash: TestComposeNATSAccounts, at the least cost; a server here checks
// cost 11 under the race detector for longer than it waits before its
// first PING, and the client fails. scripts/compose-test.sh logs in with
// the command's own.)
func TestNATSPasswdHash(t *testing.T) {
	t.Parallel()
	pw := hostilePassword(rand.New(rand.NewPCG(7, 7)))
	cmd := exec.Command(tailerBin, "nats-passwd")
	cmd.Stdin = strings.NewReader(pw + "\n")
	out, err := cmd.Output()
	h := []byte(strings.TrimSpace(string(out)))
	if err != nil || !bytes.HasPrefix(h, []byte("$2a$")) {
		t.Fatalf("tailer nats-passwd: %v, %q", err, h)
	}
	if cost, err := bcrypt.Cost(h); err != nil || cost != natsconn.PasswordCost {
		t.Errorf("cost %d (%v), want %d", cost, err, natsconn.PasswordCost)
	}
	if err := bcrypt.CompareHashAndPassword(h, []byte(pw)); err != nil {
		t.Errorf("the password the hash is of: %v", err)
	}
	if err := bcrypt.CompareHashAndPassword(h, []byte(pw+"\n")); err == nil {
		t.Error("the hash is of the password with its line end")
	}
	cmd = exec.Command(tailerBin, "nats-passwd")
	cmd.Stdin = strings.NewReader("short-pw\n")
	out, _ = cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != exitConfig || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 ||
		!strings.Contains(string(out), "the password is 8 characters") || strings.Contains(string(out), "short-pw") {
		t.Fatalf("a short password: exit %d: %s", code, out)
	}
}

// hostilePassword is a random password that holds every character that
// breaks a URL, a shell word, a .env line or a NATS configuration value.
func hostilePassword(rng *rand.Rand) string {
	const alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := []byte(`/?#@:%+&=[]!$'()*,; "\` + "`{}<>|^~")
	for range 12 {
		b = append(b, alnum[rng.IntN(len(alnum))])
	}
	rng.Shuffle(len(b), func(i, j int) { b[i], b[j] = b[j], b[i] })
	return string(b)
}

// secretFile is a compose secret holding content, as the stack mounts one
// (infra/secrets.sh writes them without a final newline).
func secretFile(t *testing.T, content string) string {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "secret")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

// checkOperatorUsers checks nats.conf's users for the operator: admin may
// edit the stream (what a scale-up or a restore needs), the tailer's user
// may not; system reaches the servers' reports, admin does not.
func checkOperatorUsers(t *testing.T, c *cluster, tailerPW, adminPW, systemPW string) {
	t.Helper()
	connect := func(user, pw string) *nats.Conn {
		nc, err := nats.Connect(c.natsURL(), nats.UserInfo(user, pw), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err != nil {
			t.Fatalf("%s: %v", user, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	edit := func(nc *nats.Conn) error {
		js, _ := jetstream.New(nc)
		s, err := js.Stream(ctx, "MAILROOM")
		if err != nil {
			return err
		}
		cfg := s.CachedInfo().Config
		cfg.Description += " (edited)"
		_, err = js.UpdateStream(ctx, cfg)
		return err
	}
	if err := edit(connect("admin", adminPW)); err != nil {
		t.Errorf("admin cannot edit the stream: %v", err)
	}
	if err := edit(connect("tailer", tailerPW)); err == nil {
		t.Error("the tailer's user may edit the stream")
	}
	// Nor touch a subscriber's consumer (issue 46): the request is
	// refused, unanswered.
	js, _ := jetstream.New(connect("tailer", tailerPW))
	del, cancelDel := context.WithTimeout(c.ctx, 2*time.Second)
	err := js.DeleteConsumer(del, "MAILROOM", "sender")
	cancelDel()
	look, cancelLook := context.WithTimeout(c.ctx, 5*time.Second)
	defer cancelLook()
	if admin, _ := jetstream.New(connect("admin", adminPW)); err == nil {
		t.Error("the tailer's user may delete the subscriber's consumer")
	} else if _, err := admin.Consumer(look, "MAILROOM", "sender"); err != nil {
		t.Errorf("the subscriber's consumer is gone after the tailer's user asked to delete it: %v", err)
	}
	if _, err := connect("system", systemPW).Request("$SYS.REQ.SERVER.PING.VARZ", nil, 2*time.Second); err != nil {
		t.Errorf("system has no server report: %v", err)
	}
	if _, err := connect("admin", adminPW).Request("$SYS.REQ.SERVER.PING.VARZ", nil, 500*time.Millisecond); err == nil {
		t.Error("admin reaches the system account's reports")
	}
}

// natsConfig is conf (nats/nats.conf, cluster.conf) completed as the
// compose file's NATS services get it: by nats/entrypoint.sh, into a
// directory of t's; it returns the completed copy's path, and checks that
// no password is in the environment the entrypoint leaves the server.
// passwords are the users' by the variable's infix: TAILER, SUBSCRIBER,
// ADMIN, SYSTEM (and ROUTE, with NATS_ROUTE_HOSTS in extra, for
// cluster.conf's routes). extra is more of the service's environment
// (NAME=value).
func natsConfig(t *testing.T, conf string, passwords map[string]string, extra ...string) string {
	t.Helper()
	copy := t.TempDir()
	cmd := exec.Command("sh", infra+"nats/entrypoint.sh", "sh", "-c", `env; echo "config $2"`, "sh", "--config", conf)
	cmd.Env = append(os.Environ(), append(extra, "NATS_CONFIG_COPY="+copy)...)
	for user, pw := range passwords {
		cmd.Env = append(cmd.Env, "NATS_"+user+"_PASSWORD_FILE="+secretFile(t, pw))
	}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("nats/entrypoint.sh: %v", err)
	}
	for user, pw := range passwords {
		// A password of a letter or two is in any environment.
		if len(pw) >= 8 && strings.Contains(string(out), pw) {
			t.Fatalf("nats/entrypoint.sh left the %s password in the server's environment:\n%s", user, out)
		}
	}
	_, path, _ := strings.Cut(string(out), "\nconfig ")
	path = strings.TrimSpace(path)
	if filepath.Dir(path) != copy {
		t.Fatalf("nats/entrypoint.sh ran the server with %q, not a copy in %s", path, copy)
	}
	return path
}

// composeDB is a PostgreSQL set up as the compose file's postgres service
// sets it up: infra/postgres/01-roles.sh run by the superuser, with random
// passwords that hold every URL-special character, and tailer migrate run
// as the schema's owner with its password apart from the URL.
type composeDB struct {
	pg        *pgtest.Server
	app       *pgx.Conn
	passwords map[string]string
}

func startComposeDB(t *testing.T, settings ...string) *composeDB {
	t.Helper()
	pg, err := pgtest.Start(pgtest.Options{Password: "super-pw", Settings: settings})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	ctx := t.Context()
	admin, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	pgtest.Exec(t, ctx, admin, `CREATE DATABASE mailroom`)
	bin, err := pgtest.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(21, uint64(time.Now().UnixNano())))
	s := &composeDB{pg: pg, passwords: map[string]string{}}
	script := exec.Command("bash", infra+"postgres/01-roles.sh")
	script.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"),
		"PGHOST=127.0.0.1", "PGPORT="+strconv.Itoa(pg.Port), "PGPASSWORD=super-pw",
		"POSTGRES_USER=postgres", "POSTGRES_DB=mailroom")
	for role, env := range map[string]string{"mailroom_owner": "OWNER", "tailer": "TAILER", "mailroom_app": "APP", "postgres_exporter": "EXPORTER"} {
		s.passwords[role] = hostilePassword(rng)
		script.Env = append(script.Env, env+"_DB_PASSWORD_FILE="+secretFile(t, s.passwords[role]))
	}
	var out bytes.Buffer
	script.Stdout, script.Stderr = &out, &out
	if err := script.Start(); err != nil {
		t.Fatal(err)
	}
	// While it runs, no process's command line or environment holds a
	// password (psql's -v held all four): sampled until it exits.
	done := make(chan error, 1)
	go func() { done <- script.Wait() }()
	samples := 0
	for running := true; running; samples++ {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("01-roles.sh: %v\n%s", err, out.String())
			}
			running = false
		default:
		}
		if where := passwordInProcesses(s.passwords); where != "" {
			t.Fatalf("a role password is in %s while 01-roles.sh runs", where)
		}
	}
	t.Logf("01-roles.sh: no password in any process's command line or environment (%d samples)", samples)
	var super bool
	if err := admin.QueryRow(ctx, `SELECT bool_or(rolsuper) FROM pg_roles WHERE rolname IN ('mailroom_owner', 'tailer', 'mailroom_app', 'postgres_exporter')`).Scan(&super); err != nil || super {
		t.Fatalf("a service role is a superuser (%v)", err)
	}
	m := exec.Command(tailerBin, "migrate")
	m.Env = append(os.Environ(), "MAILROOM_DATABASE_URL="+s.url("mailroom_owner"), "MAILROOM_DATABASE_PASSWORD_FILE="+secretFile(t, s.passwords["mailroom_owner"]))
	if out, err := m.CombinedOutput(); err != nil {
		t.Fatalf("tailer migrate as mailroom_owner: %v\n%s", err, out)
	}
	withPW, err := url.Parse(s.url("mailroom_app"))
	if err != nil {
		t.Fatal(err)
	}
	withPW.User = url.UserPassword("mailroom_app", s.passwords["mailroom_app"])
	if s.app, err = pgx.Connect(ctx, withPW.String()); err != nil {
		t.Fatalf("the application's role with its password: %v", err)
	}
	t.Cleanup(func() { s.app.Close(context.Background()) })
	return s
}

// url is role's URL without its password, as the compose file writes it.
func (s *composeDB) url(role string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/mailroom?sslmode=disable", role, s.pg.Port)
}

// tailerEnv is the tailer role's connection, as the compose file gives it.
func (s *composeDB) tailerEnv(t *testing.T) []string {
	return []string{"MAILROOM_DATABASE_URL=" + s.url("tailer"), "MAILROOM_DATABASE_PASSWORD_FILE=" + secretFile(t, s.passwords["tailer"])}
}

// cluster is an embedded NATS server beside the database, whose tailer
// processes connect as the tailer role (tailerEnv) and whose test inserts
// as the application's.
func (s *composeDB) cluster(t *testing.T) *cluster {
	t.Helper()
	port, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := embedded.Start(t.TempDir(), fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return &cluster{DB: migratetest.ExistingDB(t, s.url("tailer"), s.app), t: t, ctx: t.Context(), natsPort: port, limit: 10, timeout: 100 * time.Millisecond}
}

// exporter runs prometheus-community/postgres_exporter as the compose file
// runs it (the postgres_exporter role, its password in a password file)
// and returns its /metrics URL. It is built by scripts/postgres-exporter.sh
// (POSTGRES_EXPORTER names it); .ci/run builds it.
func (s *composeDB) exporter(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("POSTGRES_EXPORTER")
	if bin == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("POSTGRES_EXPORTER is not set: .ci/run builds it with scripts/postgres-exporter.sh")
		}
		t.Skip("postgres_exporter not built: POSTGRES_EXPORTER=$(scripts/postgres-exporter.sh) runs this check")
	}
	port, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", infra+"postgres-exporter/entrypoint.sh", bin, "--extend.query-path", infra+"postgres-exporter/queries.yaml",
		"--web.listen-address=127.0.0.1:"+strconv.Itoa(port), "--log.level=info")
	cmd.Env = append(os.Environ(), fmt.Sprintf("DATA_SOURCE_NAME=postgresql://postgres_exporter@127.0.0.1:%d/mailroom?sslmode=disable", s.pg.Port),
		"EXPORTER_DB_PASSWORD_FILE="+secretFile(t, s.passwords["postgres_exporter"]))
	var out tailertest.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("postgres_exporter:\n%s", out.String())
		}
	})
	t.Cleanup(func() {
		if strings.Contains(out.String(), s.passwords["postgres_exporter"]) {
			t.Errorf("postgres_exporter logged its password")
		}
	})
	return fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
}

// infra/postgres/01-roles.sh, run for real as the postgres image runs it:
// the schema's owner migrates without being a superuser, the tailer role
// streams, publishes and resyncs with what the migrations grant it, and
// postgres_exporter sees the slot, active and not, with pg_monitor alone.
// Every password holds every URL-special character.
func TestComposeRoles(t *testing.T) {
	t.Parallel()
	s := startComposeDB(t, "max_slot_wal_keep_size=1GB")
	c := s.cluster(t)
	p := c.tailer(s.tailerEnv(t)...)
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'role' || g || '@x', 'role' || g FROM generate_series(1, 7) g`)
	if n := c.expectExactlyOnce(30 * time.Second); n != 7 {
		t.Fatalf("%d tokens", n)
	}
	metrics := ""
	if os.Getenv("POSTGRES_EXPORTER") != "" || os.Getenv("CI") != "" {
		metrics = s.exporter(t)
		page := awaitMetrics(t, metrics, "pg_up 1", `pg_replication_slot_slot_is_active{slot_name="mailroom",slot_type="logical"} 1`)
		for _, want := range []string{`pg_replication_slot_safe_wal_size_bytes\{slot_name="mailroom",slot_type="logical"\} \d`,
			`pg_replication_slot_wal_status\{slot_name="mailroom",slot_type="logical",wal_status="reserved"\} 1\n`,
			`pg_settings_max_slot_wal_keep_size_bytes(\{[^}]*\})? 1.073741824e\+09\n`} {
			if !regexp.MustCompile(want).MatchString(page) {
				t.Errorf("postgres_exporter as postgres_exporter lacks %s", want)
			}
		}
	}
	p.term(15 * time.Second)
	if metrics != "" {
		// The tailer gone: the exporter still sees the slot, idle.
		awaitMetrics(t, metrics, `pg_replication_slot_slot_is_active{slot_name="mailroom",slot_type="logical"} 0`)
	}
	r := c.command([]string{"resync"}, s.tailerEnv(t)...)
	if code := r.exit(30 * time.Second); code != exitOK || !strings.Contains(r.out.String(), "already_on_stream=7 published=0") {
		t.Fatalf("tailer resync as the tailer role: exit %d:\n%s", code, r.out.String())
	}
	out := p.out.String() + r.out.String()
	if strings.Contains(out, "permission denied") {
		t.Fatalf("permission errors:\n%s", out)
	}
	for role, pw := range s.passwords {
		if strings.Contains(out, pw) {
			t.Fatalf("the %s password in the output:\n%s", role, out)
		}
	}
}

// nats/entrypoint.sh adds the TLS flags exactly when the TLS file sets
// NATS_TLS_CERT_FILE, and refuses a certificate without its key.
func TestNATSEntrypointTLS(t *testing.T) {
	t.Parallel()
	pw := secretFile(t, "pw")
	copy := t.TempDir()
	base := append(os.Environ(), "NATS_TAILER_PASSWORD_FILE="+pw, "NATS_SUBSCRIBER_PASSWORD_FILE="+pw,
		"NATS_ADMIN_PASSWORD_FILE="+pw, "NATS_SYSTEM_PASSWORD_FILE="+pw, "NATS_CONFIG_COPY="+copy)
	conf := "nats-server --config " + copy + "/nats.conf"
	for _, tc := range []struct {
		env  []string
		want string
		ok   bool
	}{
		{nil, conf, true},
		{[]string{"NATS_TLS_CERT_FILE=/run/secrets/cert", "NATS_TLS_KEY_FILE=/run/secrets/key"},
			conf + " --tls --tlscert /run/secrets/cert --tlskey /run/secrets/key", true},
		{[]string{"NATS_TLS_CERT_FILE=/run/secrets/cert"}, "", false},
	} {
		cmd := exec.Command("sh", infra+"nats/entrypoint.sh", "echo", "nats-server", "--config", infra+"nats/nats.conf")
		cmd.Env = append(slices.Clone(base), tc.env...)
		out, err := cmd.Output()
		if (err == nil) != tc.ok || (tc.ok && strings.TrimSpace(string(out)) != tc.want) {
			t.Errorf("env %v: %q (%v), want %q (ok %v)", tc.env, out, err, tc.want, tc.ok)
		}
	}
}

// A slot dropped under a running tailer sets tailer_slot_invalidated, and
// the rule the runbook names (TailerSlotLost) fires on the value scraped
// from it, as promtool evaluates the rules (it stayed 0: only
// TailerBlocked fired).
func TestDroppedSlotFiresTheAlert(t *testing.T) {
	t.Parallel()
	promtool := promtoolPath(t)
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	port, _ := pgtest.FreePort()
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	p := c.tailer("MAILROOM_HTTP_ADDR=127.0.0.1:"+strconv.Itoa(port), "MAILROOM_LAG_INTERVAL=100")
	p.waitLog("msg=streaming", 1, 30*time.Second)
	awaitMetrics(t, url, "\ntailer_slot_invalidated 0\n")
	// The tailer's walsender ended, the slot dropped before it comes back.
	tailertest.Eventually(t, 30*time.Second, func() error {
		c.Conn.Exec(c.ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'mailroom' AND active_pid IS NOT NULL`)
		_, err := c.Conn.Exec(c.ctx, `SELECT pg_drop_replication_slot('mailroom')`)
		return err
	})
	page := awaitMetrics(t, url, "\ntailer_slot_invalidated 1\n")
	value := regexp.MustCompile(`\ntailer_slot_invalidated (\S+)\n`).FindStringSubmatch(page)[1]
	rules, err := filepath.Abs(infra + "prometheus/rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	test := filepath.Join(t.TempDir(), "dropped_test.yml")
	if err := os.WriteFile(test, []byte(fmt.Sprintf(`rule_files: [%q]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'tailer_slot_invalidated{instance="a"}'
        values: '0 %[2]s %[2]s'
    alert_rule_test:
      - eval_time: 2m
        alertname: TailerSlotLost
        exp_alerts:
          - exp_labels: {severity: critical}
            exp_annotations:
              summary: "mailroom replication slot lost (wal_status lost, or dropped)"
              description: "Tokens are not being published. tailer status and /readyz say how to recover; see docs/operations.md, 'When the slot is lost'."
`, rules, value)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "test", "rules", test).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules on the scraped tailer_slot_invalidated %s: %v\n%s", value, err, out)
	}
}

// passwordInProcesses names the /proc file (a command line or an
// environment) that holds one of passwords, or "".
func passwordInProcesses(passwords map[string]string) string {
	pids, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range pids {
		for _, f := range []string{"cmdline", "environ"} {
			data, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				continue
			}
			for role, pw := range passwords {
				if bytes.Contains(data, []byte(pw)) {
					return fmt.Sprintf("%s/%s (the password of %s)", dir, f, role)
				}
			}
		}
	}
	return ""
}

// connectAs connects to the cluster's NATS as user, each asynchronous
// error (a permissions violation) given to onErr; the connection ends
// with t.
func (c *cluster) connectAs(t *testing.T, user, pw string, onErr func(error)) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(c.natsURL(), nats.UserInfo(user, pw),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { onErr(err) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	return nc, js
}

// checkTailerLeavesConsumers: the tailer's NATS user is refused editing,
// pulling from and acknowledging durable's consumer (it was allowed all
// three: its resync read back through an ordered consumer of a random
// name).
func checkTailerLeavesConsumers(t *testing.T, c *cluster, tailerPW, durable string) {
	t.Helper()
	violations := make(chan error, 8)
	nc, js := c.connectAs(t, "tailer", tailerPW, func(err error) { violations <- err })
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	if _, err := js.UpdateConsumer(ctx, "MAILROOM", jetstream.ConsumerConfig{Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 1}); err == nil {
		t.Errorf("the tailer's user may edit consumer %s", durable)
	}
	next, _ := json.Marshal(map[string]any{"batch": 1, "no_wait": true})
	if _, err := nc.Request("$JS.API.CONSUMER.MSG.NEXT.MAILROOM."+durable, next, 2*time.Second); err == nil {
		t.Errorf("the tailer's user may pull from consumer %s", durable)
	}
	nc.Publish("$JS.ACK.MAILROOM."+durable+".1.1.1.0.0", []byte("+ACK"))
	nc.Flush()
	select {
	case err := <-violations:
		if !strings.Contains(err.Error(), "Permissions Violation") {
			t.Errorf("an ack of consumer %s as the tailer's user: %v", durable, err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("the tailer's user may acknowledge consumer %s's messages", durable)
	}
}
