package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/mailroom/tailer/cmd/internal/config"
)

// Exit codes: one meaning each, for every command.
const (
	exitOK      = 0 // done; the check passed
	exitFailure = 1 // a problem found, or the work failed
	exitConfig  = 2 // bad input or configuration: a flag, an argument, a setting
)

// cli is one invocation: what the commands read and write, and the exit
// code the command that ran chose.
type cli struct {
	env            func(string) (string, bool)
	stdout, stderr io.Writer
	code           int
}

// usageError is a command line the commands cannot run: exit 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return &usageError{fmt.Sprintf(format, a...)} }

// execute runs the command args name, and returns its exit code. A
// command line cobra refuses (an unknown command or flag, a flag's value
// of the wrong type, an argument a command does not take) is one line
// naming it and the help that lists what is right, exit 2.
func execute(ctx context.Context, args []string, env func(string) (string, bool), stdout, stderr io.Writer) int {
	x := &cli{env: env, stdout: stdout, stderr: stderr}
	root := x.root()
	root.SetArgs(tokensLast(args))
	root.SetOut(stdout)
	root.SetErr(stderr)
	c, err := root.ExecuteContextC(ctx)
	if err == nil {
		return x.code
	}
	path := "tailer"
	if c != nil {
		path = c.CommandPath()
	}
	msg := commandFirst(err.Error(), args, c)
	if strings.HasPrefix(msg, "unknown command") && c != nil {
		// Set on the root alone, as cobra's other settings are.
		c.SuggestionsMinimumDistance = root.SuggestionsMinimumDistance
		if s := c.SuggestionsFor(firstWord(args, c)); len(s) > 0 {
			msg += "; did you mean " + strings.Join(s, " or ") + "?"
		}
	}
	if name, ok := strings.CutPrefix(msg, "unknown flag: --"); ok && c != nil {
		if s := flagSuggestions(c, name); len(s) > 0 {
			msg += "; did you mean --" + strings.Join(s, " or --") + "?"
		}
	}
	var use *usageError
	if !errors.As(err, &use) {
		msg += " (" + path + " --help lists what it takes)"
	}
	fmt.Fprintf(stderr, "%s: %s\n", path, msg)
	if c != nil && c.Flags().Lookup("json") != nil && slices.Contains(args, "--json") {
		json.NewEncoder(stdout).Encode(map[string]any{"ok": false, "error": msg})
	}
	return exitConfig
}

// commandFirst is msg, cobra's refusal of a flag, said of the command
// where the command is what is wrong: a flag given to a command that
// only groups others (tailer dead-letters --durable x: which of them?),
// or after a mistyped command (tailer subcribe --durable x: cobra
// parses the flag as the parent's first).
func commandFirst(msg string, args []string, c *cobra.Command) string {
	if c == nil || !c.HasAvailableSubCommands() || !strings.HasPrefix(msg, "unknown flag") && !strings.HasPrefix(msg, "unknown shorthand flag") {
		return msg
	}
	if word := firstWord(args, c); word != "" && !flagValue(args, word) {
		return fmt.Sprintf("unknown command %q for %q", word, c.CommandPath())
	}
	if !c.HasParent() {
		return "give a command before the flags"
	}
	var names []string
	for _, sub := range c.Commands() {
		if sub.IsAvailableCommand() {
			names = append(names, sub.Name())
		}
	}
	return "give " + strings.Join(names, " or ") + " before the flags"
}

// flagValue reports whether word comes right after a flag that does not
// hold its value (--durable x): it is the value, not a command.
func flagValue(args []string, word string) bool {
	i := slices.Index(args, word)
	return i > 0 && strings.HasPrefix(args[i-1], "-") && !strings.Contains(args[i-1], "=")
}

// firstWord is the argument cobra did not know as a command under c.
func firstWord(args []string, c *cobra.Command) string {
	depth := strings.Count(c.CommandPath(), " ")
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			continue
		}
		if depth == 0 {
			return a
		}
		depth--
	}
	return ""
}

// tokensLast moves verify's tokens behind "--": a token may start with '-'
// (base64url), and is not a flag.
func tokensLast(args []string) []string {
	if len(args) == 0 || args[0] != "verify" || slices.Contains(args, "--") {
		return args
	}
	var flags, tokens []string
	for _, a := range args {
		if looksLikeToken(a) {
			tokens = append(tokens, a)
		} else {
			flags = append(flags, a)
		}
	}
	if len(tokens) == 0 {
		return args
	}
	return append(append(flags, "--"), tokens...)
}

const rootLong = `tailer: publish mailroom tokens from PostgreSQL's WAL to NATS JetStream,
and hand them on exactly once.

Every setting is a MAILROOM_* environment variable and the matching flag;
"tailer COMMAND --help" lists a command's, with its variable. Exit codes:
0 done, 1 a problem found or the work failed, 2 bad input or configuration.`

func (x *cli) root() *cobra.Command {
	root := &cobra.Command{
		Use:                        "tailer",
		Long:                       rootLong,
		SilenceErrors:              true,
		SilenceUsage:               true,
		DisableSuggestions:         true, // execute suggests, on the error's line
		SuggestionsMinimumDistance: 2,
		Args:                       cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			c.SetOut(x.stderr)
			c.Help()
			x.code = exitConfig
			return nil
		},
	}
	root.AddGroup(
		&cobra.Group{ID: "relay", Title: "Relaying tokens:"},
		&cobra.Group{ID: "consume", Title: "Handing them on:"},
		&cobra.Group{ID: "operate", Title: "Operating:"},
	)
	for _, c := range []*cobra.Command{x.runCmd(), x.migrateCmd(), x.resyncCmd()} {
		c.GroupID = "relay"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{x.subscribeCmd(), x.deadLettersCmd()} {
		c.GroupID = "consume"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{x.statusCmd(), x.auditCmd(), x.healthCmd(), x.verifyCmd(), x.natsMetricsCmd(), x.natsPasswdCmd(), x.versionCmd()} {
		c.GroupID = "operate"
		root.AddCommand(c)
	}
	root.SetHelpCommandGroupID("operate")
	root.SetCompletionCommandGroupID("operate")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return err })
	// --version on every command, as on the root.
	root.PersistentFlags().Bool("version", false, "print the version and exit")
	root.SetVersionTemplate(versionLine() + "\n")
	setVersion(root, versionLine())
	return root
}

func setVersion(c *cobra.Command, v string) {
	c.Version = v
	for _, sub := range c.Commands() {
		setVersion(sub, v)
	}
}

// leaf makes c a command of the tree: strict arguments (none, unless
// args says otherwise), help that lists its settings by group, and its
// code the exit code. run returns it.
func (x *cli) leaf(c *cobra.Command, run func(c *cobra.Command, args []string) int) *cobra.Command {
	if c.Args == nil {
		c.Args = noArgs
	}
	c.RunE = func(c *cobra.Command, args []string) error {
		x.code = run(c, args)
		return nil
	}
	c.SetUsageFunc(usage)
	return c
}

// noArgs refuses any argument, naming the first.
func noArgs(c *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unexpected argument %q: usage: %s (%s --help lists the flags)", args[0], c.UseLine(), c.CommandPath())
	}
	return nil
}

// settings binds the settings vars names to c's flags. keyed: the
// command signs or verifies, and a missing key is its configuration error.
// The loader it returns prints a bad setting as the command's one line.
func (x *cli) settings(c *cobra.Command, vars []string, keyed bool) func() (*config.Config, error) {
	f := config.Bind(c.Flags(), vars)
	return func() (*config.Config, error) {
		cfg, err := f.Config(x.env)
		if err == nil && keyed {
			err = cfg.RequireKey()
		}
		if err != nil {
			fmt.Fprintf(x.stderr, "%s: %v\n", c.CommandPath(), err)
			return nil, err
		}
		return cfg, nil
	}
}

// usage writes c's usage: its synopsis, its own flags, its settings under
// their groups, the flags of every command.
func usage(c *cobra.Command) error {
	w := c.OutOrStderr()
	fmt.Fprintf(w, "Usage:\n  %s\n", c.UseLine())
	if c.HasExample() {
		fmt.Fprintf(w, "\nExamples:\n%s\n", c.Example)
	}
	groups := map[string]*pflag.FlagSet{}
	var order []string
	c.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
		g := "Flags"
		if a := f.Annotations[config.GroupAnnotation]; len(a) > 0 {
			g = a[0]
		}
		if groups[g] == nil {
			groups[g] = pflag.NewFlagSet(g, pflag.ContinueOnError)
			order = append(order, g)
		}
		groups[g].AddFlag(f)
	})
	// The command's own flags first, then the settings in config.Groups'
	// order.
	rank := func(g string) int {
		return slices.IndexFunc(config.Groups, func(p string) bool { return strings.HasPrefix(g, p) })
	}
	slices.SortStableFunc(order, func(a, b string) int { return rank(a) - rank(b) })
	for _, g := range order {
		fmt.Fprintf(w, "\n%s:\n%s", g, groups[g].FlagUsagesWrapped(100))
	}
	fmt.Fprintf(w, "\nFor every command:\n%s", c.InheritedFlags().FlagUsagesWrapped(100))
	return nil
}

// flagSuggestions are the flags of c within two edits of name, or that
// begin with it, as cobra suggests commands.
func flagSuggestions(c *cobra.Command, name string) []string {
	var out []string
	seen := map[string]bool{}
	visit := func(f *pflag.Flag) {
		if !seen[f.Name] && !f.Hidden && (editDistance(name, f.Name) <= 2 || len(name) > 2 && strings.HasPrefix(f.Name, name)) {
			seen[f.Name] = true
			out = append(out, f.Name)
		}
	}
	c.Flags().VisitAll(visit)
	c.InheritedFlags().VisitAll(visit)
	return out
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
