package action

import (
	"fmt"
	"strconv"
	"strings"
)

// CodeLen is the length of the code signed into password recovery
// tokens (Actions).
const CodeLen = 5

// MaxCodeLen is the most bytes a token's code has: the width of the
// tokens.code column (VARCHAR(5)); no action's code is longer.
const MaxCodeLen = 5

// Action is what a token is for: its place in Actions, counted from 1,
// which is also how mailroom's lines print it. 0 is no action.
type Action uint8

// Spec is everything the tailer does differently for one action;
// each part of the tailer reads it here, none names an action itself.
type Spec struct {
	// Label is the action's value of the token_action enum type: the
	// tokens.action column, a JSON body's "action", the suffix of its
	// lane's subject (MAILROOM_SUBJECT_PER_ACTION), --filter-action.
	Label string
	// Prefix is what mailroom signs before the token's secret: the
	// signed input is Prefix ‖ secret ‖ code ("/recover" ‖ secret ‖
	// "01234").
	Prefix string
	// CodeLen is the length of the code signed after the secret (the
	// tokens.code column, mailed beside the token); 0: the action has
	// none, and its code column is not read.
	CodeLen int
	// Status is the accounts.status the token's account must have when
	// its batch is cut; a token whose account has another is skipped.
	Status string
}

// Actions are the token actions, Actions[a-1] being Action a's. A new
// action is a row here and a value of the database's token_action type
// (a migration); its lane, subject, line number, signed input, code rule
// and status check follow from the row. A token of an action the
// database has and this table lacks stops the tailer before it is
// confirmed. Tests may add rows before anything reads them (TestMain);
// nothing changes it after.
var Actions = []Spec{
	{Label: "activation", Prefix: "/activate", Status: "provisioned"},
	{Label: "password_recovery", Prefix: "/recover", CodeLen: CodeLen, Status: "active"},
}

// Max is the most rows Actions may have: the batcher keeps a lane
// for each in fixed-size arrays, copied at every commit.
const Max = 8

// The actions of mailroom's schema, by name, for the code and tests that
// mean one of them in particular.
const (
	Activation       Action = 1
	PasswordRecovery Action = 2
)

// Spec returns a's row of Actions; false for no action.
func (a Action) Spec() (Spec, bool) {
	if a == 0 || int(a) > len(Actions) {
		return Spec{}, false
	}
	return Actions[a-1], true
}

// Lane is a's lane, from 0: batches of one action a lane.
func (a Action) Lane() int { return int(a) - 1 }

// String returns a's label, or "unknown".
func (a Action) String() string {
	if s, ok := a.Spec(); ok {
		return s.Label
	}
	return "unknown"
}

// Parse returns the action of a token_action label.
func Parse(label string) (Action, error) {
	if a, ok := Of([]byte(label)); ok {
		return a, nil
	}
	return 0, fmt.Errorf("unknown token action %q, want %s", label, strings.Join(Labels(), " or "))
}

// Of returns the action labelled label, as the decoder reads it from
// a row (no copy of it is made: a string of it would cost the decoder an
// allocation a token).
func Of(label []byte) (Action, bool) {
	for i, s := range Actions {
		if string(label) == s.Label {
			return Action(i + 1), true
		}
	}
	return 0, false
}

// ParseNumber returns the action a line prints as s ("1").
func ParseNumber(s string) (Action, bool) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > len(Actions) || strconv.Itoa(n) != s {
		return 0, false
	}
	return Action(n), true
}

// Labels are the actions' labels, in Action order.
func Labels() []string {
	out := make([]string, len(Actions))
	for i, s := range Actions {
		out[i] = s.Label
	}
	return out
}
