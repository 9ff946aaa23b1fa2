package main

import (
	"bytes"
	"encoding/hex"
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

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/decoder/action"
	"github.com/mailroom/tailer/publish/token"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/mailroom/tailer/internal/testutil/natstest"
	"github.com/mailroom/tailer/internal/testutil/pgtest"
)

const goodKey = "cafebabecafebabecafebabecafebabecafebabecafebabecafebabecafebabe"

func TestBadConfiguration(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "key")
	os.WriteFile(keyFile, []byte("tooshort\n"), 0o600)
	twoPrimaries := filepath.Join(t.TempDir(), "keyring")
	os.WriteFile(twoPrimaries, []byte("a "+goodKey+" primary\nb "+strings.Repeat("ab", 32)+" primary\n"), 0o600)
	base := map[string]string{
		"MAILROOM_DATABASE_URL": "postgres://u@127.0.0.1:1/db",
		"MAILROOM_SECRET_KEY":   goodKey,
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string // the variable the error must name
	}{
		{"missing database URL", map[string]string{"MAILROOM_DATABASE_URL": ""}, nil, "MAILROOM_DATABASE_URL: is required"},
		{"keyring with two primary keys", map[string]string{"MAILROOM_SECRET_KEY": "", "MAILROOM_KEYRING_FILE": twoPrimaries}, nil, "MAILROOM_KEYRING_FILE: the keyring file line 2: key b is primary, and so is key a"},
		{"keyring missing", map[string]string{"MAILROOM_SECRET_KEY": "", "MAILROOM_KEYRING_FILE": "/nonexistent/ring"}, nil, "MAILROOM_KEYRING_FILE: cannot read the keyring file it names"},
		{"keyring beside a key", map[string]string{"MAILROOM_KEYRING_FILE": twoPrimaries}, nil, "MAILROOM_KEYRING_FILE: set together with MAILROOM_SECRET_KEY"},
		{"database URL not a URL", map[string]string{"MAILROOM_DATABASE_URL": "mysql://x"}, nil, "MAILROOM_DATABASE_URL"},
		{"missing key", map[string]string{"MAILROOM_SECRET_KEY": ""}, nil, "MAILROOM_SECRET_KEY: is required"},
		{"key too short", map[string]string{"MAILROOM_SECRET_KEY": goodKey[:62]}, nil, "MAILROOM_SECRET_KEY: must be exactly 64 hex characters, got 62"},
		{"key not hex", map[string]string{"MAILROOM_SECRET_KEY": strings.Repeat("zz", 32)}, nil, "MAILROOM_SECRET_KEY: must contain only hex"},
		{"key file bad", map[string]string{"MAILROOM_SECRET_KEY": "", "MAILROOM_SECRET_KEY_FILE": keyFile}, nil, "MAILROOM_SECRET_KEY_FILE"},
		{"key file missing", map[string]string{"MAILROOM_SECRET_KEY": "", "MAILROOM_SECRET_KEY_FILE": "/nonexistent/key"}, nil, "MAILROOM_SECRET_KEY_FILE: cannot read the key file it names: no such file or directory (value not shown: 16 characters)"},
		{"batch limit 0", map[string]string{"MAILROOM_BATCH_LIMIT": "0"}, nil, "MAILROOM_BATCH_LIMIT: must be a whole number from 1"},
		{"batch limit negative", map[string]string{"MAILROOM_BATCH_LIMIT": "-5"}, nil, "MAILROOM_BATCH_LIMIT"},
		{"batch limit flag", nil, []string{"--batch-limit", "abc"}, "MAILROOM_BATCH_LIMIT"},
		{"timeout negative", map[string]string{"MAILROOM_BATCH_TIMEOUT": "-1"}, nil, "MAILROOM_BATCH_TIMEOUT: must be a whole number of milliseconds"},
		{"bad slot name", map[string]string{"MAILROOM_SLOT": "mail room; DROP"}, nil, "MAILROOM_SLOT"},
		{"slot name upper case", nil, []string{"--slot", "Mailroom"}, "MAILROOM_SLOT"},
		{"bad NATS URL", map[string]string{"MAILROOM_NATS_URL": "localhost"}, nil, "MAILROOM_NATS_URL: must be nats://host:port"},
		{"bad format", map[string]string{"MAILROOM_FORMAT": "xml"}, nil, "MAILROOM_FORMAT"},
		{"bad stream", map[string]string{"MAILROOM_NATS_STREAM": "a.b"}, nil, "MAILROOM_NATS_STREAM"},
		{"stream with a newline", map[string]string{"MAILROOM_NATS_STREAM": "MAILROOM\n"}, nil, "MAILROOM_NATS_STREAM: must be a stream name of printable characters"},
		{"subject with a newline", map[string]string{"MAILROOM_NATS_SUBJECT": "mailroom.batches\n"}, nil, "MAILROOM_NATS_SUBJECT"},
		{"bad subject", map[string]string{"MAILROOM_NATS_SUBJECT": "a.*"}, nil, "MAILROOM_NATS_SUBJECT"},
		{"bad http addr", map[string]string{"MAILROOM_HTTP_ADDR": "9187"}, nil, "MAILROOM_HTTP_ADDR"},
		{"bad proto", map[string]string{"MAILROOM_PROTO_VERSION": "3"}, nil, "MAILROOM_PROTO_VERSION"},
		{"bad log level", map[string]string{"MAILROOM_LOG_LEVEL": "loud"}, nil, "MAILROOM_LOG_LEVEL"},
		{"in-flight above the client's cap", map[string]string{"MAILROOM_MAX_IN_FLIGHT": "1025"}, nil, "MAILROOM_MAX_IN_FLIGHT: must be auto or a whole number from 1 to 1000"},
		{"replication timeout too short", map[string]string{"MAILROOM_REPLICATION_TIMEOUT": "10"}, nil, "MAILROOM_REPLICATION_TIMEOUT"},
		{"pprof not a bool", map[string]string{"MAILROOM_PPROF": "maybe"}, nil, "MAILROOM_PPROF"},
		{"unreachable NATS URL", map[string]string{"MAILROOM_NATS_URL": "nats://127.0.0.1:1", "MAILROOM_HTTP_ADDR": ""}, []string{"--http-addr="}, "MAILROOM_NATS_URL: cannot connect to nats://127.0.0.1:1"},
		{"NATS URL without its scheme's slashes", map[string]string{"MAILROOM_NATS_URL": "nats//u:pw@127.0.0.1:4222"}, nil, "MAILROOM_NATS_URL: must be nats://host:port"},
		{"second NATS URL without a scheme", map[string]string{"MAILROOM_NATS_URL": "nats://h:4222,h2:4222"}, nil, "URL 2 of 2 is not"},
		{"database key=value with a bad port", map[string]string{"MAILROOM_DATABASE_URL": "host=127.0.0.1 port=x dbname=mailroom"}, nil, "MAILROOM_DATABASE_URL: cannot be parsed"},
		{"database password with a slash", map[string]string{"MAILROOM_DATABASE_URL": "postgres://u:pa/ss@127.0.0.1:5432/db"}, nil, "percent-encode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := func(k string) string {
				if v, ok := tc.env[k]; ok {
					return v
				}
				return base[k]
			}
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"run"}, tc.args...), lookup(env), &stdout, &stderr)
			if code != exitConfig {
				t.Fatalf("exit code %d, want %d; stderr: %s", code, exitConfig, stderr.String())
			}
			out := stderr.String()
			if lines := strings.Count(strings.TrimSpace(out), "\n") + 1; lines != 1 {
				t.Errorf("error is %d lines, want one:\n%s", lines, out)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("error %q does not contain %q", out, tc.want)
			}
			if strings.Contains(out, goodKey[:16]) {
				t.Errorf("error repeats the key: %q", out)
			}
			// Refused before anything started: no embedded NATS store.
			if _, err := os.Stat("tailer-data"); err == nil {
				t.Fatal("a refused configuration started the embedded NATS server (tailer-data exists)")
			}
		})
	}
}

func TestVerifyCommand(t *testing.T) {
	env := func(k string) string {
		if k == "MAILROOM_SECRET_KEY" {
			return goodKey
		}
		return ""
	}
	vectors := readVectors(t)
	for _, v := range vectors {
		if v.KeyHex != goodKey {
			continue
		}
		args := []string{"verify", v.Token}
		if v.Action == "password_recovery" {
			args = []string{"verify", "--code", v.Code, v.Token}
		}
		var out, errOut bytes.Buffer
		if code := run(args, lookup(env), &out, &errOut); code != exitOK {
			t.Fatalf("verify %v: exit %d: %s%s", args, code, out.String(), errOut.String())
		}
		if v.Action == "password_recovery" {
			var bad bytes.Buffer
			if code := run([]string{"verify", "--code", "00000", v.Token}, lookup(env), &bad, &bad); code != exitFailure || !strings.Contains(bad.String(), `together with code "00000": the code, or the key, is not the one it was issued with`) {
				t.Fatalf("wrong code: exit %d: %s", code, bad.String())
			}
			bad.Reset()
			if code := run([]string{"verify", v.Token}, lookup(env), &bad, &bad); code != exitFailure || !strings.Contains(bad.String(), "give it with --code CODE") {
				t.Fatalf("a recovery token without --code: exit %d: %s", code, bad.String())
			}
			// The action named, and one no table row has.
			bad.Reset()
			if code := run([]string{"verify", "--action", "password_recovery", "--code", v.Code, v.Token}, lookup(env), &bad, &bad); code != exitOK {
				t.Fatalf("--action password_recovery: exit %d: %s", code, bad.String())
			}
			bad.Reset()
			if code := run([]string{"verify", "--action", "magic", "--code", v.Code, v.Token}, lookup(env), &bad, &bad); code != exitConfig || !strings.Contains(bad.String(), `unknown token action "magic", want activation or password_recovery`) {
				t.Fatalf("--action magic: exit %d: %s", code, bad.String())
			}
		}
	}
	if n := countKey(vectors, goodKey); n == 0 {
		t.Fatal("no vectors for the test key")
	}
	// A token is base64url: one in 64 starts with '-', which is a token
	// all the same, not a flag.
	key, _ := hex.DecodeString(goodKey)
	signer, err := token.NewSigner("k", key)
	if err != nil {
		t.Fatal(err)
	}
	// The first six bits 62: base64url's '-'.
	secret := [token.SecretSize]byte{0xF8}
	dashed, err := signer.AppendToken(nil, action.Activation, &secret, nil)
	if err != nil || dashed[0] != '-' {
		t.Fatalf("a token starting with '-': %s, %v", dashed, err)
	}
	var out bytes.Buffer
	if code := run([]string{"verify", string(dashed)}, lookup(env), &out, &out); code != exitOK || !strings.Contains(out.String(), "valid activation token") {
		t.Fatalf("verify %s: exit %d: %s", dashed, code, out.String())
	}
}

type vector struct {
	KeyHex string `json:"key_hex"`
	Action string `json:"action"`
	Code   string `json:"code"`
	Token  string `json:"token"`
}

func readVectors(t *testing.T) []vector {
	data, err := os.ReadFile("../../publish/token/testdata/signing-vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct{ Vectors []vector }
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	return doc.Vectors
}

func countKey(vs []vector, key string) (n int) {
	for _, v := range vs {
		if v.KeyHex == key {
			n++
		}
	}
	return n
}

// Secret settings never show their value: not in --help, not in the usage
// printed for a mistyped flag, not in errors.
func TestSecretsNeverShown(t *testing.T) {
	const (
		dbPass   = "db-hunter2-pass"
		natsPass = "nats-hunter2-pass"
	)
	env := map[string]string{
		"MAILROOM_DATABASE_URL": "postgres://tailer:" + dbPass + "@127.0.0.1:1/db",
		"MAILROOM_SECRET_KEY":   goodKey,
		"MAILROOM_NATS_URL":     "nats://tailer:" + natsPass + "@127.0.0.1:1",
	}
	getenv := func(k string) string { return env[k] }
	for _, args := range [][]string{
		{"run", "--help"}, {"run", "--no-such-flag"}, {"status", "--help"}, {"migrate", "--help"},
		{"verify", "--help"}, {"subscribe", "--help"}, {"subscribe", "--durable", "d", "--no-such-flag"},
		{"run", "--http-addr="}, // unreachable NATS: the startup error names the URL
		{"subscribe", "--durable", "d"},
		{"run", "--nats-url", "nats://tailer:" + natsPass + "@"}, // invalid URL echoed in the error
		// Malformed URLs that still carry the password, in every shape.
		{"run", "--nats-url", "nats//tailer:" + natsPass + "@127.0.0.1:24230"},
		{"run", "--nats-url", "nats:/tailer:" + natsPass + "@127.0.0.1"},
		{"run", "--nats-url", "tailer:" + natsPass + "@127.0.0.1"},
		{"run", "--nats-url", "nats://127.0.0.1:4222,tailer:" + natsPass + "@127.0.0.2:4222"},
		{"status", "--nats-url", "nats//tailer:" + natsPass + "@h"},
		{"subscribe", "--durable", "d", "--nats-url", "tailer:" + natsPass + "@h"},
		{"run", "--database-url", "postgres://tailer:" + dbPass + "/x@127.0.0.1:5432/db"},
		{"run", "--database-url", "postgres://tailer:" + dbPass + "@127.0.0.1:x/db"},
		{"run", "--database-url", "host=127.0.0.1 port=x password=" + dbPass},
		{"run", "--database-url", "postgres//tailer:" + dbPass + "@h/db"},
		{"run", "--secret-key-file", dbPass},
		{"run", "--slot", dbPass},
		{"run", "--nats-stream", dbPass + "."},
	} {
		var stdout, stderr bytes.Buffer
		run(args, lookup(getenv), &stdout, &stderr)
		out := stdout.String() + stderr.String()
		for _, secret := range []string{dbPass, natsPass, goodKey[:16]} {
			if strings.Contains(out, secret) {
				t.Errorf("tailer %s shows a secret (%s...):\n%s", strings.Join(args, " "), secret[:4], out)
			}
		}
	}
}

// A key given with surrounding whitespace (a file written by echo, an
// editor's newline) is the same key: a token signed with the bare key
// verifies with it, and fails with another key.
func TestKeyWithTrailingNewline(t *testing.T) {
	key, err := hex.DecodeString(goodKey)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := token.NewSigner("k", key)
	if err != nil {
		t.Fatal(err)
	}
	var secret [token.SecretSize]byte
	secret[0] = 7
	signed, err := signer.AppendToken(nil, action.Activation, &secret, nil)
	if err != nil {
		t.Fatal(err)
	}
	verify := func(k string) (int, string) {
		var stdout, stderr bytes.Buffer
		code := run([]string{"verify", string(signed)}, lookup(func(name string) string {
			if name == "MAILROOM_SECRET_KEY" {
				return k
			}
			return ""
		}), &stdout, &stderr)
		return code, stdout.String() + stderr.String()
	}
	for _, k := range []string{goodKey, goodKey + "\n", goodKey + "\r\n", " " + goodKey, "\t" + goodKey + " \n"} {
		if code, out := verify(k); code != exitOK {
			t.Errorf("key %q: token signed with the key does not verify (exit %d): %s", k, code, out)
		}
	}
	other := strings.Repeat("ab", token.KeySize)
	if code, out := verify(other + "\n"); code != exitFailure {
		t.Errorf("another key: exit %d, want %d (invalid): %s", code, exitFailure, out)
	}
}

// A wrong password for PostgreSQL or NATS at startup is a configuration
// error: one line, exit 2, the password not repeated.
func TestWrongCredentialsAtStartup(t *testing.T) {
	t.Parallel()
	const dbPass, natsPass = "right-db-pass", "right-nats-pass"
	pg, err := pgtest.Start(pgtest.Options{Password: dbPass})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	ns := natstest.Server(t, &server.Options{Host: "127.0.0.1", Port: -1, Username: "tailer", Password: natsPass, JetStream: true, StoreDir: t.TempDir()})
	natsURL := func(pass string) string {
		return fmt.Sprintf("nats://tailer:%s@%s", pass, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	}
	dbURL := func(pass, db string) string {
		return fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/%s?sslmode=disable", pass, pg.Port, db)
	}
	for _, tc := range []struct {
		name, db, nats, want, secret string
	}{
		{"database password", dbURL("wrong-db-pass", "postgres"), natsURL(natsPass), "MAILROOM_DATABASE_URL: authentication failed", "wrong-db-pass"},
		{"database name", dbURL(dbPass, "nosuchdb"), natsURL(natsPass), `MAILROOM_DATABASE_URL: database "nosuchdb" does not exist`, dbPass},
		{"NATS password", dbURL(dbPass, "postgres"), natsURL("wrong-nats-pass"), "MAILROOM_NATS_URL: cannot connect to nats://REDACTED@", "wrong-nats-pass"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(tailerBin, "run", "--http-addr=", "--lag-interval=60000")
			cmd.Env = append(os.Environ(), "MAILROOM_DATABASE_URL="+tc.db, "MAILROOM_SECRET_KEY="+goodKey, "MAILROOM_NATS_URL="+tc.nats)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			done := make(chan error, 1)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			go func() { done <- cmd.Wait() }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
				<-done
				t.Fatalf("tailer still running after 30s (retrying a configuration error?):\n%s", out.String())
			}
			text := strings.TrimSpace(out.String())
			if code := cmd.ProcessState.ExitCode(); code != exitConfig {
				t.Fatalf("exit code %d, want %d:\n%s", code, exitConfig, text)
			}
			if lines := strings.Count(text, "\n") + 1; lines != 1 {
				t.Errorf("error is %d lines, want one:\n%s", lines, text)
			}
			if !strings.Contains(text, tc.want) {
				t.Errorf("error %q does not contain %q", text, tc.want)
			}
			if strings.Contains(text, tc.secret) {
				t.Errorf("error repeats the password: %q", text)
			}
		})
	}
}

// Every command's help lists its own flags.
// Each command's --help lists every flag it takes: each setting of the
// command's list (by its flag, the whole name: -format is not found inside
// -log-format), and the subscriber's own options.
func TestHelpListsEveryFlag(t *testing.T) {
	declared := regexp.MustCompile(`(?m)^ +(?:-[a-z], )?--([a-z0-9-]+)`)
	flagsOf := func(vars []string) []string {
		var flags []string
		for _, v := range config.Vars {
			if slices.Contains(vars, v.Env) {
				flags = append(flags, v.Flag)
			}
		}
		if len(flags) != len(vars) {
			t.Fatalf("%d of %d settings found in config.Vars", len(flags), len(vars))
		}
		return flags
	}
	for cmd, flags := range map[string][]string{
		"subscribe": {"durable", "format", "max-tokens-per-line", "from-start", "filter-action", "dedup-window", "ack-wait", "exec", "nats-url", "nats-stream", "nats-subject"},
		"run":       flagsOf(runVars),
		"resync":    flagsOf(resyncVars),
		"migrate":   flagsOf(migrateVars),
		"health":    {"http-addr"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{cmd, "--help"}, lookup(func(string) string { return "" }), &stdout, &stderr); code != exitOK {
			t.Errorf("%s --help: exit %d", cmd, code)
		}
		listed := map[string]bool{}
		for _, m := range declared.FindAllStringSubmatch(stderr.String()+stdout.String(), -1) {
			listed[m[1]] = true
		}
		for _, f := range flags {
			if !listed[f] {
				t.Errorf("%s --help does not list --%s:\n%s", cmd, f, stdout.String())
			}
		}
	}
}

// tailer health fails when no tailer answers, and says so on a bad address.
func TestHealthWithoutTailer(t *testing.T) {
	port, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr string
		code int
	}{{"127.0.0.1:" + strconv.Itoa(port), exitFailure}, {"", exitConfig}, {"nonsense", exitConfig}} {
		var out bytes.Buffer
		code := run([]string{"health", "--http-addr=" + tc.addr}, lookup(func(string) string { return "" }), &out, &out)
		if code != tc.code {
			t.Errorf("health --http-addr=%q: exit %d, want %d:\n%s", tc.addr, code, tc.code, out.String())
		}
	}
}

// lookup is getenv as os.LookupEnv: an empty value is an unset variable.
func lookup(getenv func(string) string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v := getenv(k)
		return v, v != ""
	}
}

// Arguments nobody checked (issue 46: migrate sideways and migrate DOWN
// ran up, status bogus and run extra were accepted): each is exit 2 with
// one line naming it, before anything is done; version and --version
// print the version.
func TestStrictArguments(t *testing.T) {
	env := map[string]string{"MAILROOM_DATABASE_URL": "postgres://u@127.0.0.1:1/db", "MAILROOM_SECRET_KEY": goodKey}
	get := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"migrate", "sideways"}, exitConfig, `unexpected argument "sideways": migrate takes up (the default) or down`},
		{[]string{"migrate", "DOWN"}, exitConfig, `unexpected argument "DOWN"`},
		{[]string{"status", "bogus"}, exitConfig, `tailer status: unexpected argument "bogus"`},
		{[]string{"run", "extra"}, exitConfig, `tailer run: unexpected argument "extra"`},
		{[]string{"resync", "now"}, exitConfig, `tailer resync: unexpected argument "now"`},
		{[]string{"subscribe", "--durable", "d", "more"}, exitConfig, `unexpected argument "more"`},
		{[]string{"dead-letters", "list", "--durable", "d", "more"}, exitConfig, `unexpected argument "more"`},
		{[]string{"nosuch"}, exitConfig, `unknown command "nosuch"`},
		{[]string{"version"}, exitOK, "tailer "},
		{[]string{"--version"}, exitOK, "tailer "},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, get, &stdout, &stderr)
		out := stdout.String() + stderr.String()
		if code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("tailer %s: exit %d, want %d with %q:\n%s", strings.Join(tc.args, " "), code, tc.code, tc.want, out)
		}
		if code == exitConfig && !strings.Contains(tc.want, "unknown command") && strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 {
			t.Errorf("tailer %s: more than one line:\n%s", strings.Join(tc.args, " "), stderr.String())
		}
	}
}
