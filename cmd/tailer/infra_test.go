package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.yaml.in/yaml/v3"

	"github.com/mailroom/tailer/cmd/internal/daemon"
	"github.com/mailroom/tailer/testutil/pgtest"
)

const infra = "../../infra/"

type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Volumes     []string          `yaml:"volumes"`
		DependsOn   map[string]struct {
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
	if n := c.Services["nats"]; !slices.Contains(n.Command, "--jetstream") || len(n.Volumes) == 0 {
		t.Errorf("nats service: command %v, volumes %v; want JetStream on a volume", n.Command, n.Volumes)
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
	if len(cluster.Services) != 3 {
		t.Fatalf("cluster has %d nodes", len(cluster.Services))
	}
	for name, s := range cluster.Services {
		cmd := strings.Join(s.Command, " ")
		if !strings.Contains(cmd, "--jetstream") || !strings.Contains(cmd, "--routes") || !strings.Contains(cmd, "--cluster_name mailroom") {
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
	restricted := strings.Replace(c.dbURL, "postgres://postgres@", "postgres://tailer@", 1)
	var privileged bool
	if err := c.db.QueryRow(ctx, `SELECT rolsuper OR rolcreatedb FROM pg_roles WHERE rolname = 'tailer'`).Scan(&privileged); err != nil || privileged {
		t.Fatalf("role tailer: privileged=%v, %v", privileged, err)
	}
	p := c.tailer("MAILROOM_DATABASE_URL=" + restricted)
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.exec(`INSERT INTO accounts (email, login) SELECT 'role' || g || '@x', 'role' || g FROM generate_series(1, 12) g`)
	if n := c.expectExactlyOnce(30 * time.Second); n != 12 {
		t.Fatalf("%d tokens", n)
	}
	if strings.Contains(p.out.String(), "permission denied") {
		t.Fatalf("permission errors:\n%s", p.out.String())
	}
}
