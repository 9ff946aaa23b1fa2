package config

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/spf13/pflag"
)

// The headings settings are listed under in help, in order.
const (
	GroupPostgreSQL = "PostgreSQL settings"
	GroupSigning    = "Signing settings"
	GroupBatches    = "Batch settings"
	GroupNATS       = "NATS settings"
	GroupOperations = "Operation settings"
)

// Groups lists the headings in help order.
var Groups = []string{GroupPostgreSQL, GroupSigning, GroupBatches, GroupNATS, GroupOperations}

// GroupAnnotation is the flag annotation that holds a setting's Group.
const GroupAnnotation = "mailroom_group"

// setting is a setting's flag value: the text as given, checked by
// Flags.Config with the same parser as the environment's. Type is the
// setting's, for help.
type setting struct{ text, typ string }

func (s *setting) String() string     { return s.text }
func (s *setting) Set(v string) error { s.text = v; return nil }
func (s *setting) Type() string       { return s.typ }

// Flags are a command's settings bound to its flag set.
type Flags struct {
	fs   *pflag.FlagSet
	use  []Var
	vals map[string]*setting
}

// Bind adds the settings use names (by environment variable, in help
// order) to fs as flags. The help text names each one's variable and
// file; a flag's default is the static one, never the environment's,
// which may hold passwords and keys.
func Bind(fs *pflag.FlagSet, use []string) *Flags {
	byEnv := varsByEnv()
	f := &Flags{fs: fs, vals: make(map[string]*setting, len(use))}
	for _, env := range use {
		v, ok := byEnv[env]
		if !ok {
			panic("config: unknown setting " + env)
		}
		usage := v.Usage + " [" + v.Env + "]"
		if v.fromFile(byEnv) {
			usage += " (or the content of the file " + v.Env + "_FILE names)"
		}
		s := &setting{typ: v.Type}
		fs.Var(s, v.Flag, usage)
		fl := fs.Lookup(v.Flag)
		fl.DefValue = v.Default
		if v.Type == "bool" {
			fl.NoOptDefVal = "true"
		}
		fl.Annotations = map[string][]string{GroupAnnotation: {v.Group}}
		f.use = append(f.use, v)
		f.vals[env] = s
	}
	return f
}

// Config resolves and checks every bound setting, once fs is parsed: the
// flag if given, else the environment variable (lookupEnv, as
// os.LookupEnv), else the file <Env>_FILE names (secrets), else the
// default. An empty environment variable is the default, unless its empty
// value means something (Var.EmptyIsValue). A bad value is an *Error.
func (f *Flags) Config(lookupEnv func(string) (string, bool)) (*Config, error) {
	byEnv := varsByEnv()
	c := &Config{}
	for _, v := range f.use {
		val, given := f.vals[v.Env].text, f.fs.Changed(v.Flag)
		if !given {
			val = v.Default
			if e, ok := lookupEnv(v.Env); ok && (e != "" || v.EmptyIsValue) {
				val, given = e, true
			}
		}
		if path, ok := lookupEnv(v.Env + "_FILE"); ok && path != "" && v.fromFile(byEnv) {
			if given {
				return nil, &Error{Var: v.Env, Err: fmt.Errorf("set together with %s_FILE: use one of them", v.Env)}
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return nil, &Error{Var: v.Env + "_FILE", Err: fmt.Errorf("cannot read %s: %v", path, pathErr(err))}
			}
			val = FileValue(b)
		}
		if err := v.set(c, val); err != nil {
			return nil, &Error{Var: v.Env, Err: v.shown(err, val)}
		}
	}
	return c, nil
}

// shown is err of val with val in it when the setting cannot hold a
// secret, else with its length only (see Var.Shown).
func (v Var) shown(err error, val string) error {
	var bad *valueError
	if !errors.As(err, &bad) {
		return err
	}
	if v.Shown {
		return fmt.Errorf("%s, got %q", bad.msg, val)
	}
	return fmt.Errorf("%s (value not shown: %d characters)", bad.msg, utf8.RuneCountInString(val))
}

// Load is Bind and Config for a program without a command line of its
// own, and for tests: args are flags of the settings in use, and nothing
// else.
func Load(use, args []string, lookupEnv func(string) (string, bool)) (*Config, error) {
	fs := pflag.NewFlagSet("settings", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f := Bind(fs, use)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return f.Config(lookupEnv)
}

func varsByEnv() map[string]Var {
	byEnv := make(map[string]Var, len(Vars))
	for _, v := range Vars {
		byEnv[v.Env] = v
	}
	return byEnv
}

// FileValue is the value a setting's file holds (<Env>_FILE): its
// content, one line end taken off (files end in a newline more often than
// passwords do). Whatever else reads a secret's file for the stack
// (tailer nats-passwd) reads it so, or a hash of it would not match.
func FileValue(b []byte) string {
	return strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
}
