package main

import (
	"context"
	"encoding/json"
	"fmt"
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

	"github.com/mailroom/tailer/cmd/internal/daemon"
	"github.com/mailroom/tailer/publish/embedded"
	"github.com/mailroom/tailer/testutil/pgtest"
	"github.com/mailroom/tailer/testutil/tailertest"
)

const infra = "../../infra/"

type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
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
	for _, name := range []string{"postgres", "nats", "migrate", "tailer", "prometheus", "grafana"} {
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
	if g := c.Services["grafana"].Environment; g["GF_AUTH_ANONYMOUS_ENABLED"] != "false" || !strings.HasPrefix(g["GF_SECURITY_ADMIN_PASSWORD"], "${GRAFANA_ADMIN_PASSWORD:?") {
		t.Errorf("grafana: anonymous access and an admin password: %v", g)
	}
	if _, ok := c.Services["alertmanager"]; !ok {
		t.Error("no alertmanager: the alert rules would fire into nothing")
	}
	if got := c.Services["migrate"].Command; !slices.Equal(got, []string{"migrate"}) {
		t.Errorf("migrate command = %v", got)
	}
	tailer := c.Services["tailer"]
	if tailer.DependsOn["migrate"].Condition != "service_completed_successfully" {
		t.Errorf("tailer must start after migrate completes: %+v", tailer.DependsOn)
	}
	// The daemon and the migration run as different roles.
	runURL, migrateURL := tailer.Environment["MAILROOM_DATABASE_URL"], c.Services["migrate"].Environment["MAILROOM_DATABASE_URL"]
	if !strings.HasPrefix(runURL, "postgres://tailer:") || strings.HasPrefix(migrateURL, "postgres://tailer:") {
		t.Errorf("run URL %q, migrate URL %q: want the tailer role for run only", runURL, migrateURL)
	}
	if tailer.Environment["MAILROOM_SECRET_KEY"] != "" || tailer.Environment["MAILROOM_SECRET_KEY_FILE"] == "" {
		t.Error("the key must come from a secret file, not the compose file")
	}
	if tailer.Environment["MAILROOM_NATS_URL"] == "" {
		t.Error("the tailer must use the nats service, not its embedded server")
	}

	cluster := readCompose(t, infra+"nats-cluster/docker-compose.yml")
	for path, f := range map[string]composeFile{"docker-compose.yml": c, "nats-cluster/docker-compose.yml": cluster} {
		for name, s := range f.Services {
			// Every port on loopback only.
			for _, p := range s.Ports {
				if !strings.HasPrefix(p, "127.0.0.1:") {
					t.Errorf("%s: %s publishes %q on every interface", path, name, p)
				}
			}
			// The server version the tests embed (see the nats service).
			if strings.HasPrefix(s.Image, "nats:") && s.Image != "nats:"+server.VERSION {
				t.Errorf("%s: %s runs %s; the tests embed nats-server %s", path, name, s.Image, server.VERSION)
			}
			if strings.HasPrefix(s.Image, "nats:") && !slices.Contains(s.Command, "--config") {
				t.Errorf("%s: %s runs without nats/nats.conf: anonymous access", path, name)
			}
		}
		raw, err := os.ReadFile(infra + path)
		if err != nil {
			t.Fatal(err)
		}
		// ${VAR:-default} would start the stack with a password anyone can read here.
		if m := regexp.MustCompile(`\$\{[A-Z_]*(PASSWORD|SECRET|KEY|TOKEN)[A-Z_]*:-[^}]*\}`).Find(raw); m != nil {
			t.Errorf("%s: %s gives a secret a default", path, m)
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
	if len(cluster.Services) != 3 {
		t.Fatalf("cluster has %d nodes", len(cluster.Services))
	}
	for name, s := range cluster.Services {
		cmd := strings.Join(s.Command, " ")
		if !strings.Contains(cmd, "--routes") || !strings.Contains(cmd, "--cluster_name mailroom") {
			t.Errorf("%s: %s", name, cmd)
		}
	}

	docker, err := os.ReadFile(infra + "Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	d := string(docker)
	if strings.Count(d, "\nFROM ") < 1 || strings.Count(d, "FROM ") != 2 || !strings.Contains(d, "CGO_ENABLED=0") || !strings.Contains(d, "USER nonroot") {
		t.Errorf("Dockerfile must be multi-stage, static and non-root:\n%s", d)
	}
}

var metricRe = regexp.MustCompile(`\btailer_[a-z_]+`)

// referencedMetrics returns the tailer metric families named in the alert
// rules and the dashboard.
func referencedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	refs := map[string][]string{}
	add := func(where, expr string) {
		for _, m := range metricRe.FindAllString(expr, -1) {
			// Histogram series name their family with a suffix.
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if base, ok := strings.CutSuffix(m, suffix); ok && (strings.HasSuffix(base, "_seconds") || strings.HasSuffix(base, "_tokens")) {
					m = base
				}
			}
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
	for _, want := range []string{"TailerSlotLagHigh", "TailerNotReady", "TailerStalled"} {
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

func TestDashboardAndRulesUseExportedMetrics(t *testing.T) {
	refs := referencedMetrics(t)
	c := newCluster(t, pgtest.Shared(t), 10, 100*time.Millisecond)
	port, _ := pgtest.FreePort()
	c.tailer("MAILROOM_HTTP_ADDR=127.0.0.1:"+strconv.Itoa(port), "MAILROOM_LAG_INTERVAL=100")
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	var page string
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := httpGet(url)
		if code == 200 && strings.Contains(body, "tailer_slot_lag_bytes ") {
			page = body
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no slot sample on /metrics: %d %s", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	exported := map[string]bool{}
	for _, line := range strings.Split(page, "\n") {
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			exported[strings.Fields(rest)[0]] = true
		}
	}
	for name, where := range refs {
		if !exported[name] {
			t.Errorf("%s (used by %s) is not exported", name, strings.Join(where, ", "))
		}
	}
	for _, name := range daemon.MetricNames {
		if !exported[name] {
			t.Errorf("%s is in MetricNames but not exported", name)
		}
	}
}

func TestPromtoolCheckRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool is missing: .ci/run installs it from Debian's prometheus package")
		}
		t.Skip("promtool not installed (apt-get install prometheus); CI runs this check")
	}
	out, err := exec.Command(promtool, "check", "rules", infra+"prometheus/rules.yml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	out, err = exec.Command(promtool, "check", "config", "--syntax-only", infra+"prometheus/prometheus.yml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
}

// The compose file runs the daemon as a role with only REPLICATION and the
// SELECTs migration 000003 grants; this checks that is enough.
func TestRunsAsRestrictedRole(t *testing.T) {
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
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		c.t.Fatal(err)
	}
	c.stopNATS()
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", c.natsPort, 0
	opts.StoreDir, opts.NoSigs, opts.NoLog = c.t.TempDir(), true, true
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
	t.Setenv("NATS_TAILER_PASSWORD", "tailer-test-pw")
	t.Setenv("NATS_SUBSCRIBER_PASSWORD", "subscriber-test-pw")
	c := newCluster(t, pgtest.Shared(t), 10, 100*time.Millisecond)
	c.startNATSConfig(infra + "nats/nats.conf")
	if nc, err := nats.Connect(c.natsURL()); err == nil {
		nc.Close()
		t.Fatal("anonymous connection accepted")
	}
	asTailer := []string{"MAILROOM_NATS_USER=tailer", "MAILROOM_NATS_PASSWORD=tailer-test-pw"}
	p := c.tailer(asTailer...)
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'acl' || g || '@x', 'acl' || g FROM generate_series(1, 20) g`)

	out := filepath.Join(t.TempDir(), "out")
	sub := c.subscriber(out, "--durable", "sender", "--from-start", "--nats-user", "subscriber", "--nats-password", "subscriber-test-pw")
	deadline := time.Now().Add(30 * time.Second)
	for {
		if tokens, _ := outputTokens(t, out); len(tokens) == 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("subscriber output incomplete:\n%s\ntailer:\n%s", sub.out.String(), p.out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}

	nc, err := nats.Connect(c.natsURL(), nats.UserInfo("subscriber", "subscriber-test-pw"),
		// The refusals below are the point: no need to print them.
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
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

	if code := p.term(15 * time.Second); code != 0 {
		t.Fatalf("tailer exit %d", code)
	}
	r := c.command([]string{"resync"}, asTailer...)
	if code := r.exit(30 * time.Second); code != exitOK || !strings.Contains(r.out.String(), "already_on_stream=20 published=0") {
		t.Fatalf("resync as the tailer's user: exit %d:\n%s", code, r.out.String())
	}
	for _, bad := range [][]string{nil, {"MAILROOM_NATS_USER=tailer", "MAILROOM_NATS_PASSWORD=wrong-pw"}} {
		p := c.tailer(bad...)
		if code := p.exit(30 * time.Second); code != exitConfig || strings.Count(p.out.String(), "\n") != 1 || strings.Contains(p.out.String(), "wrong-pw") {
			t.Fatalf("tailer with credentials %v: exit %d, want %d and one line without the password:\n%s", bad, code, exitConfig, p.out.String())
		}
	}
}

// infra/postgres/01-roles.sh, run for real as the postgres image runs it:
// the schema's owner migrates without being a superuser, and the tailer
// role streams, publishes and resyncs with what the migrations grant it.
func TestComposeRoles(t *testing.T) {
	pg, err := pgtest.Start(pgtest.Options{Password: "super-pw"})
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
	script := exec.Command("bash", infra+"postgres/01-roles.sh")
	script.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"),
		"PGHOST=127.0.0.1", "PGPORT="+strconv.Itoa(pg.Port), "PGPASSWORD=super-pw",
		"POSTGRES_USER=postgres", "POSTGRES_DB=mailroom",
		"OWNER_DB_PASSWORD=owner-pw", "TAILER_DB_PASSWORD=tailer-pw", "APP_DB_PASSWORD=app-pw")
	if out, err := script.CombinedOutput(); err != nil {
		t.Fatalf("01-roles.sh: %v\n%s", err, out)
	}
	var super bool
	if err := admin.QueryRow(ctx, `SELECT bool_or(rolsuper) FROM pg_roles WHERE rolname IN ('mailroom_owner', 'tailer', 'mailroom_app')`).Scan(&super); err != nil || super {
		t.Fatalf("a service role is a superuser (%v)", err)
	}
	roleURL := func(role, pw string) string {
		return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/mailroom?sslmode=disable", role, pw, pg.Port)
	}
	m := exec.Command(tailerBin, "migrate")
	m.Env = append(os.Environ(), "MAILROOM_DATABASE_URL="+roleURL("mailroom_owner", "owner-pw"))
	if out, err := m.CombinedOutput(); err != nil {
		t.Fatalf("tailer migrate as mailroom_owner: %v\n%s", err, out)
	}

	port, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := embedded.Start(t.TempDir(), fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	app, err := pgx.Connect(ctx, roleURL("mailroom_app", "app-pw"))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close(ctx)
	c := &cluster{DB: tailertest.ExistingDB(t, roleURL("tailer", "tailer-pw"), app), t: t, ctx: ctx, natsPort: port, limit: 10, timeout: 100 * time.Millisecond}
	p := c.tailer()
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'role' || g || '@x', 'role' || g FROM generate_series(1, 7) g`)
	if n := c.expectExactlyOnce(30 * time.Second); n != 7 {
		t.Fatalf("%d tokens", n)
	}
	p.term(15 * time.Second)
	r := c.command([]string{"resync"})
	if code := r.exit(30 * time.Second); code != exitOK || !strings.Contains(r.out.String(), "already_on_stream=7 published=0") {
		t.Fatalf("tailer resync as the tailer role: exit %d:\n%s", code, r.out.String())
	}
	if out := p.out.String() + r.out.String(); strings.Contains(out, "permission denied") {
		t.Fatalf("permission errors:\n%s", out)
	}
}
