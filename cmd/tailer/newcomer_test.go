package main

import (
	"bytes"
	"net"
	"strings"
	"testing"

	"github.com/mailroom/tailer/decoder/action"
	"github.com/mailroom/tailer/publish/token"
)

// A newcomer's stumbles with the commands (issue 72): each mistake gets
// its exit code and one line that names the setting or the fix.
func TestNewcomerStumbles(t *testing.T) {
	free := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	key, _ := token.ParseKey(goodKey)
	signer, _ := token.NewSigner("k", key)
	activation, err := signer.AppendToken(nil, action.Activation, &[token.SecretSize]byte{1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		code int
		want []string
	}{
		{"a mistyped flag", []string{"run", "--batch-limt", "5"}, nil, exitConfig,
			[]string{"unknown flag: --batch-limt; did you mean --batch-limit?"}},
		{"a mistyped flag of subscribe", []string{"subscribe", "--durabel", "x"}, nil, exitConfig,
			[]string{"did you mean --durable?"}},
		{"health with nothing listening", []string{"health"}, map[string]string{"MAILROOM_HTTP_ADDR": free()}, exitFailure,
			[]string{"tailer health: nothing answers at http://", "(MAILROOM_HTTP_ADDR, or --http-addr)"}},
		{"verify --code on an activation token", []string{"verify", "--code", "123456", string(activation)}, map[string]string{"MAILROOM_SECRET_KEY": goodKey}, exitFailure,
			[]string{"it is a valid activation token, which is signed without a code: drop --code"}},
		{"subscribe with no NATS URL and nothing at the listen address", []string{"subscribe", "--durable", "x"},
			map[string]string{"MAILROOM_NATS_LISTEN": free(), "MAILROOM_DATA_DIR": t.TempDir()}, exitConfig,
			[]string{"cannot connect to NATS at nats://127.0.0.1:", "(MAILROOM_NATS_URL unset: no tailer run on MAILROOM_DATA_DIR says where its embedded server listens, so MAILROOM_NATS_LISTEN; set MAILROOM_NATS_URL to your NATS servers)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := func(k string) string { return tc.env[k] }
			var out bytes.Buffer
			code := run(tc.args, lookup(env), &out, &out)
			said := out.String()
			if code != tc.code {
				t.Fatalf("tailer %s: exit %d, want %d:\n%s", strings.Join(tc.args, " "), code, tc.code, said)
			}
			for _, w := range tc.want {
				if !strings.Contains(said, w) {
					t.Errorf("tailer %s said:\n%s\nwant it to say %q", strings.Join(tc.args, " "), said, w)
				}
			}
			if n := strings.Count(strings.TrimSpace(said), "\n"); n > 0 {
				t.Errorf("%d lines, want one:\n%s", n+1, said)
			}
		})
	}
}
