package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// Every command with --help, --version, an unknown flag, an unknown
// argument and bad input (issue 46): the documented exit code; help and
// the version on stdout; a refusal one line on stderr naming the problem
// and where the fix is; status --json JSON on every path. Nothing here
// reaches a server: each refusal comes before any connection.
func TestEveryCommandLine(t *testing.T) {
	env := map[string]string{"MAILROOM_DATABASE_URL": "postgres://u@127.0.0.1:1/db", "MAILROOM_SECRET_KEY": goodKey}
	get := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	commands := [][]string{{"run"}, {"migrate"}, {"resync"}, {"status"}, {"status", "--json"}, {"health"}, {"verify"}, {"subscribe"},
		{"dead-letters", "list"}, {"dead-letters", "resend"}, {"nats-metrics"}, {"nats-passwd"}, {"version"}}
	for _, cmd := range commands {
		path := "tailer " + strings.Join(strings.Fields(strings.ReplaceAll(strings.Join(cmd, " "), "--json", "")), " ")
		extra := []string{"bogus"}
		if cmd[0] == "verify" {
			extra = []string{"one", "two"}
		}
		for _, tc := range []struct {
			args []string
			code int
			want string // on stdout (exit 0), or in the one line of stderr
		}{
			{[]string{"--help"}, exitOK, "Usage:\n  " + path},
			{[]string{"--version"}, exitOK, "tailer (devel)"},
			{[]string{"--no-such-flag"}, exitConfig, path + ": unknown flag: --no-such-flag (" + path + " --help lists what it takes)"},
			{extra, exitConfig, map[bool]string{true: "give exactly one token", false: `"bogus"`}[cmd[0] == "verify"]},
		} {
			checkCommandLine(t, append(append([]string{}, cmd...), tc.args...), get, tc.code, tc.want)
		}
	}
	// Bad input, each refused before any connection.
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"status", "--json"}, map[string]string{"MAILROOM_DATABASE_URL": "postgres://u:p@ss/w0rd@127.0.0.1:1/db"}, "percent-encode the password"},
		{[]string{"status"}, map[string]string{"MAILROOM_DATABASE_URL": "postgres://u:p@ss/w0rd@127.0.0.1:1/db"}, "MAILROOM_DATABASE_PASSWORD"},
		{[]string{"run", "--batch-limit", "ten"}, env, `MAILROOM_BATCH_LIMIT: must be a whole number from 1 to`},
		{[]string{"run", "--binary=maybe"}, env, `MAILROOM_BINARY: must be true or false, got "maybe"`},
		{[]string{"run"}, map[string]string{"MAILROOM_DATABASE_URL": "postgres://u@127.0.0.1:1/db"}, "MAILROOM_SECRET_KEY"},
		{[]string{"migrate", "sideways"}, env, `unexpected argument "sideways": migrate takes up (the default) or down`},
		{[]string{"subscribe", "--durable", "d", "--ack-wait", "soon"}, env, `invalid argument "soon" for "--ack-wait"`},
		{[]string{"subscribe"}, env, "--durable: a consumer name"},
		{[]string{"subscribe", "--durable", "d", "--into", "inbox"}, env, "MAILROOM_INBOX_URL"},
		{[]string{"dead-letters"}, env, "give list or resend"},
		{[]string{"nosuch"}, env, `unknown command "nosuch" for "tailer"`},
		{[]string{"stauts"}, env, `did you mean status?`},
		{[]string{"subcribe", "--durable", "x"}, env, `unknown command "subcribe" for "tailer"; did you mean subscribe?`},
		{[]string{"dead-letters", "--durable", "x"}, env, `give list or resend before the flags`},
		{[]string{"dead-letters", "lst", "--durable", "x"}, env, `did you mean list?`},
		{[]string{"--durable", "x"}, env, `give a command before the flags`},
	} {
		checkCommandLine(t, tc.args, func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }, exitConfig, tc.want)
	}
	// PostgreSQL that does not answer: the work failed (exit 1), said in
	// one line as a configuration error is (migrate logged it, status
	// said it in three lines).
	down := map[string]string{"MAILROOM_DATABASE_URL": "postgres://u@127.0.0.1:1/db"}
	for _, args := range [][]string{{"migrate"}, {"status"}} {
		checkCommandLine(t, args, func(k string) (string, bool) { v, ok := down[k]; return v, ok }, exitFailure,
			"cannot connect to PostgreSQL at 127.0.0.1:1 (MAILROOM_DATABASE_URL): dial error: dial tcp 127.0.0.1:1: connect: connection refused; is the server up")
	}
}

// checkCommandLine runs tailer args and checks its exit code, and that
// want is on stdout (exit 0) or on the one line of stderr (exit 2); with
// --json, stdout must be JSON.
func checkCommandLine(t *testing.T, args []string, env func(string) (string, bool), code int, want string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	got := run(args, env, &stdout, &stderr)
	line := "tailer " + strings.Join(args, " ")
	switch {
	case got != code:
		t.Errorf("%s: exit %d, want %d:\n%s%s", line, got, code, stdout.String(), stderr.String())
	case code == exitOK && (!strings.Contains(stdout.String(), want) || stderr.Len() > 0):
		t.Errorf("%s: want %q on stdout, nothing on stderr:\nstdout: %s\nstderr: %s", line, want, stdout.String(), stderr.String())
	case code != exitOK && (strings.Count(stderr.String(), "\n") != 1 || !strings.HasSuffix(stderr.String(), "\n")):
		t.Errorf("%s: want one line on stderr, got:\n%s", line, stderr.String())
	case code != exitOK && !strings.Contains(stderr.String(), want):
		t.Errorf("%s: want %q in %q", line, want, stderr.String())
	}
	for _, a := range args {
		if a == "--json" && code != exitOK && !json.Valid(stdout.Bytes()) {
			t.Errorf("%s: stdout is not JSON: %q", line, stdout.String())
		}
	}
}
