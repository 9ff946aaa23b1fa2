package config

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/pflag"
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
			getenv := func(k string) (string, bool) {
				if k == target.Env && !asFlag {
					return value, true
				}
				if k == "MAILROOM_SECRET_KEY" && target.Env == "MAILROOM_SECRET_KEY_FILE" {
					return "", false
				}
				v, ok := base[k]
				return v, ok
			}
			var args []string
			if asFlag {
				args = []string{"--" + target.Flag + "=" + value}
			}
			_, err := Load(allVars(), args, getenv)
			return err
		}
		err := load(value)
		if err == nil {
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

// MAILROOM_HTTP_ADDR set to the empty string in the environment disables
// HTTP, as --http-addr= does; other settings set empty take their default.
func TestEmptyEnvironmentValues(t *testing.T) {
	env := map[string]string{"MAILROOM_DATABASE_URL": "postgres://u@h/db", "MAILROOM_HTTP_ADDR": "", "MAILROOM_BATCH_LIMIT": ""}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	c, err := Load([]string{"MAILROOM_DATABASE_URL", "MAILROOM_HTTP_ADDR", "MAILROOM_BATCH_LIMIT"}, nil, lookup)
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTPAddr != "" || c.BatchLimit != 10 {
		t.Fatalf("HTTPAddr %q, BatchLimit %d; want disabled and the default 10", c.HTTPAddr, c.BatchLimit)
	}
	delete(env, "MAILROOM_HTTP_ADDR")
	if c, err = Load([]string{"MAILROOM_DATABASE_URL", "MAILROOM_HTTP_ADDR"}, nil, lookup); err != nil || c.HTTPAddr != "127.0.0.1:9187" {
		t.Fatalf("unset MAILROOM_HTTP_ADDR = %q, %v; want the default", c.HTTPAddr, err)
	}
}

// FuzzSecretsInMalformedURLs plants a password in URLs of every shape an
// operator may mistype (a missing scheme or slash, a password with URL
// characters, a second cluster URL without a scheme, key=value strings),
// for every URL setting: whether the value is accepted or refused, the
// error and the help never show the password.
func FuzzSecretsInMalformedURLs(f *testing.F) {
	shapes := []string{
		"nats//u:%s@127.0.0.1:4222", "nats:/u:%s@h", "u:%s@h", "nats://h:4222,u:%s@h2", "nats://u:%s@", "nats://u:%s@h:x",
		"postgres://u:%s@h:5432/db", "postgres//u:%s@h/db", "postgres://u:%s@h:x/db", "host=h port=x password=%s", "host=h password='%s", "%s",
	}
	for i := range shapes {
		for _, pw := range []string{"Hunter2pass", "pa/ss#w?rd", "p@ss:word", "Zm9v%zzBar", "x y z secret"} {
			f.Add(uint8(i), pw, i%2 == 0)
		}
	}
	urlVars := []string{"MAILROOM_DATABASE_URL", "MAILROOM_NATS_URL"}
	f.Fuzz(func(t *testing.T, shape uint8, pw string, database bool) {
		if len(pw) < 6 || strings.ContainsAny(pw, "\x00\n\r") {
			return
		}
		value := fmt.Sprintf(shapes[int(shape)%len(shapes)], pw)
		target := urlVars[0]
		if !database {
			target = urlVars[1]
		}
		env := map[string]string{"MAILROOM_DATABASE_URL": "postgres://u@h/db", target: value}
		var out strings.Builder
		_, err := Load(urlVars, nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		msg := out.String()
		if err != nil {
			msg += err.Error()
		}
		if strings.Contains(msg, pw) {
			t.Fatalf("%s=%q: the password shows: %q", target, value, msg)
		}
	})
}

// FuzzDatabasePassword: any password given in MAILROOM_DATABASE_PASSWORD
// reaches the server as it is, beside a URL or a key=value string that
// carries no password, or another one.
func FuzzDatabasePassword(f *testing.F) {
	printable := make([]byte, 0, 95)
	for c := byte(' '); c <= '~'; c++ {
		printable = append(printable, c)
	}
	for _, pw := range []string{string(printable), "ab/cd+ef==", `it's\a 'quoted' \\ pass`, "p@ss:w/rd?#%zz", " lead and trail ", "ünïcode"} {
		for i := range 4 {
			f.Add(uint8(i), pw)
		}
	}
	dsns := []string{
		"postgres://owner@db:5432/mailroom?sslmode=disable",
		"postgresql://owner:old%2Fpw@db1:5432,db2:5433/mailroom?application_name=x",
		"host=db port=5432 user=owner dbname=mailroom sslmode=disable",
		"host=db user=owner password='old' dbname=mailroom",
	}
	f.Fuzz(func(t *testing.T, which uint8, pw string) {
		if pw == "" || strings.ContainsRune(pw, 0) || !utf8.ValidString(pw) {
			return
		}
		dsn := dsns[int(which)%len(dsns)]
		env := map[string]string{"MAILROOM_DATABASE_URL": dsn, "MAILROOM_DATABASE_PASSWORD": pw}
		c, err := Load([]string{"MAILROOM_DATABASE_URL", "MAILROOM_DATABASE_PASSWORD"}, nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		if err != nil {
			if strings.Contains(err.Error(), pw) {
				t.Fatalf("the password shows: %v", err)
			}
			t.Fatalf("%s with a password apart: %v", dsn, err)
		}
		cfg, err := pgconn.ParseConfig(c.DatabaseURL)
		if err != nil {
			t.Fatalf("merged connection string does not parse: %v", err)
		}
		if cfg.Password != pw || cfg.User != "owner" || cfg.Database != "mailroom" {
			t.Fatalf("user %q, database %q, password %q; want owner, mailroom, %q", cfg.User, cfg.Database, cfg.Password, pw)
		}
	})
}

// Every secret setting may come from a file (<ENV>_FILE), read as written
// but for one final newline; set both ways, or the file unreadable, is one
// error that names the setting and never shows the secret.
func TestSecretsFromFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pw := write("pw", "s3cr et#$'\"\n")
	crlf := write("crlf", "tok\r\n")
	url := write("url", "postgres://tailer@db:5432/mailroom\n")
	use := []string{"MAILROOM_DATABASE_URL", "MAILROOM_DATABASE_PASSWORD", "MAILROOM_NATS_USER", "MAILROOM_NATS_PASSWORD", "MAILROOM_NATS_TOKEN"}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		args    []string
		check   func(*Config) bool
		wantErr string
	}{
		{"files", map[string]string{"MAILROOM_NATS_USER": "u", "MAILROOM_DATABASE_URL_FILE": url, "MAILROOM_DATABASE_PASSWORD_FILE": pw, "MAILROOM_NATS_PASSWORD_FILE": pw, "MAILROOM_NATS_TOKEN_FILE": crlf},
			nil, func(c *Config) bool {
				return strings.Contains(c.DatabaseURL, "db:5432") && c.NATSPassword == "s3cr et#$'\"" && c.NATSToken == "tok"
			}, ""},
		{"both", map[string]string{"MAILROOM_DATABASE_URL": "postgres://x@y/z", "MAILROOM_NATS_PASSWORD": "a", "MAILROOM_NATS_PASSWORD_FILE": pw},
			nil, nil, "MAILROOM_NATS_PASSWORD: set together with MAILROOM_NATS_PASSWORD_FILE: use one of them"},
		{"both, by flag", map[string]string{"MAILROOM_DATABASE_URL": "postgres://x@y/z", "MAILROOM_NATS_PASSWORD_FILE": pw},
			[]string{"--nats-password", "a"}, nil, "MAILROOM_NATS_PASSWORD: set together with MAILROOM_NATS_PASSWORD_FILE: use one of them"},
		{"unreadable", map[string]string{"MAILROOM_DATABASE_URL": "postgres://x@y/z", "MAILROOM_DATABASE_PASSWORD_FILE": filepath.Join(dir, "none")},
			nil, nil, "MAILROOM_DATABASE_PASSWORD_FILE: cannot read " + filepath.Join(dir, "none") + ": no such file or directory"},
		{"empty name is unset", map[string]string{"MAILROOM_DATABASE_URL": "postgres://x@y/z", "MAILROOM_NATS_USER": "u", "MAILROOM_NATS_PASSWORD": "a", "MAILROOM_NATS_PASSWORD_FILE": ""},
			nil, func(c *Config) bool { return c.NATSPassword == "a" }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			c, err := Load(use, tc.args, lookup)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), "s3cr") {
					t.Fatalf("the error shows the secret: %v", err)
				}
				return
			}
			if err != nil || !tc.check(c) {
				t.Fatalf("err = %v, config %+v", err, c)
			}
		})
	}
	// MAILROOM_SECRET_KEY has its own file setting: no second one.
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	Bind(fs, []string{"MAILROOM_SECRET_KEY", "MAILROOM_SECRET_KEY_FILE", "MAILROOM_NATS_PASSWORD"})
	if help := fs.FlagUsages(); strings.Contains(help, "MAILROOM_SECRET_KEY_FILE_FILE") || !strings.Contains(help, "MAILROOM_NATS_PASSWORD_FILE") {
		t.Fatalf("help:\n%s", help)
	}
}

// A password with any printable byte, unencoded, in MAILROOM_DATABASE_URL,
// MAILROOM_INBOX_URL or MAILROOM_NATS_URL: the setting is refused (exit 2)
// with a message that holds no piece of the password, or it parses as
// meant: the host is the host and the password whole, so no piece of the
// password is ever a host name to look up (issue 46: with p@ss/w0rd the
// tailer printed database=w0rd@... and looked up "ss").
func TestHostileURLPasswords(t *testing.T) {
	for c := byte(' '); c <= '~'; c++ {
		pw := "Ab" + string(c) + "Secr3tTail"
		for _, tc := range []struct{ env, url string }{
			{"MAILROOM_DATABASE_URL", "postgres://owner:" + pw + "@127.0.0.1:31432/mailroom"},
			{"MAILROOM_INBOX_URL", "postgresql://owner:" + pw + "@127.0.0.1:31432/inbox"},
			{"MAILROOM_NATS_URL", "nats://tailer:" + pw + "@127.0.0.1:4222"},
		} {
			env := map[string]string{"MAILROOM_DATABASE_URL": "postgres://u@h/db", tc.env: tc.url}
			var out strings.Builder
			use := []string{"MAILROOM_DATABASE_URL", "MAILROOM_INBOX_URL", "MAILROOM_NATS_URL"}
			cfg, err := Load(use, nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
			if err != nil {
				if msg := out.String() + err.Error(); strings.Contains(msg, "Secr3t") || strings.Contains(msg, "3tTail") {
					t.Errorf("%s with %q in the password: a piece of it shows: %s", tc.env, c, msg)
				}
				continue
			}
			host, user, got := "", "", ""
			switch tc.env {
			case "MAILROOM_NATS_URL":
				u, err := url.Parse(cfg.NATSURL)
				if err != nil {
					t.Fatalf("%s accepted and does not parse: %v", tc.env, err)
				}
				host, user = u.Host, u.User.Username()
				got, _ = u.User.Password()
			default:
				dsn := cfg.DatabaseURL
				if tc.env == "MAILROOM_INBOX_URL" {
					dsn = cfg.InboxURL
				}
				pc, err := pgconn.ParseConfig(dsn)
				if err != nil {
					t.Fatalf("%s accepted and does not parse: %v", tc.env, err)
				}
				host, user, got = fmt.Sprintf("%s:%d", pc.Host, pc.Port), pc.User, pc.Password
			}
			if want := map[string]string{"MAILROOM_NATS_URL": "127.0.0.1:4222"}[tc.env]; want == "" && host != "127.0.0.1:31432" || want != "" && host != want || got != pw || user == "" {
				t.Errorf("%s with %q in the password accepted as host %q, user %q, password %q: not as meant", tc.env, c, host, user, got)
			}
		}
	}
}
