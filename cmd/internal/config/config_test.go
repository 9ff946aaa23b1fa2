package config

import (
	"errors"
	"flag"
	"io"
	"net/url"
	"strings"
	"testing"
)

func allVars() []string {
	names := make([]string, len(Vars))
	for i, v := range Vars {
		names[i] = v.Env
	}
	return names
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                       "nats://127.0.0.1:4222",
		"nats://user:secret@h:4222":                   "nats://REDACTED@h:4222",
		"nats://tokenvalue@h:4222,nats://u:p@h2:4222": "nats://REDACTED@h:4222,nats://REDACTED@h2:4222",
		"nats://u:p%zz@h":                             "(a URL with user information that does not parse)",
		"postgres://tailer:pw@db:5432/mailroom?x=1":   "postgres://REDACTED@db:5432/mailroom?x=1",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzLoad gives one setting (chosen by which) an arbitrary value, from the
// environment or as a flag, the others valid ones. Load must not panic; a
// rejection is one *Error naming that setting, on one line, that never shows
// the secret part of the value.
func FuzzLoad(f *testing.F) {
	for _, s := range []string{"", "1", "true", "mailroom", "nats://u:secretpass@h:4222", "nats://u:secretpass@", "postgres://u:secretpass@h/db",
		"mysql://u:secretpass@h", strings.Repeat("ab", 32), strings.Repeat("ab", 32) + "\n", "127.0.0.1:9187", "-1", "99999999999999999999", "a\nb", "json"} {
		for which := range Vars {
			f.Add(uint8(which), s, which%2 == 0)
		}
	}
	base := map[string]string{"MAILROOM_DATABASE_URL": "postgres://u@h/db", "MAILROOM_SECRET_KEY": strings.Repeat("ab", 32)}
	f.Fuzz(func(t *testing.T, which uint8, value string, asFlag bool) {
		target := Vars[int(which)%len(Vars)]
		load := func(value string) error {
			getenv := func(k string) string {
				if k == target.Env && !asFlag {
					return value
				}
				if k == "MAILROOM_SECRET_KEY" && target.Env == "MAILROOM_SECRET_KEY_FILE" {
					return ""
				}
				return base[k]
			}
			var args []string
			if asFlag {
				args = []string{"--" + target.Flag + "=" + value}
			}
			_, _, err := Load("fuzz", allVars(), args, getenv, io.Discard)
			return err
		}
		err := load(value)
		if err == nil || errors.Is(err, flag.ErrHelp) {
			return
		}
		var cerr *Error
		if !errors.As(err, &cerr) {
			t.Fatalf("error %v is not a configuration error", err)
		}
		msg := err.Error()
		if strings.ContainsAny(msg, "\n\r") {
			t.Fatalf("error is not one line: %q", msg)
		}
		// The secret part of the value: all of it for the key, the
		// password of a URL. It leaked if the message shows it, and shows
		// it no more once it is replaced by filler of the same length.
		var secret string
		switch cerr.Var {
		case "MAILROOM_SECRET_KEY":
			secret = value
		case "MAILROOM_DATABASE_URL", "MAILROOM_NATS_URL":
			if u, err := url.Parse(value); err == nil && u.User != nil {
				secret, _ = u.User.Password()
			}
		}
		if len(secret) < 4 || !strings.Contains(msg, secret) {
			return
		}
		filler := strings.Repeat("#", len(secret))
		if other := load(strings.Replace(value, secret, filler, 1)); other == nil || !strings.Contains(other.Error(), secret) {
			t.Fatalf("%s error shows its secret: %q", cerr.Var, msg)
		}
	})
}
