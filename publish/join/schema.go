package join

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mailroom/tailer/decoder/action"
	"github.com/mailroom/tailer/internal/pgname"
)

// kind is what the tailer needs a column to be.
type kind uint8

const (
	anyType kind = iota // only its presence (consumed_at IS NULL)
	integer             // smallint, integer or bigint
	label               // an enum, or text
	text                // text, varchar, char or citext
	bytes               // bytea
)

func (k kind) String() string {
	switch k {
	case integer:
		return "smallint, integer or bigint"
	case label:
		return "an enum or text"
	case text:
		return "text, varchar, char or citext"
	case bytes:
		return "bytea"
	}
	return "any type"
}

func (k kind) accepts(typname string, typtype byte) bool {
	switch k {
	case integer:
		return typname == "int2" || typname == "int4" || typname == "int8"
	case text:
		return typname == "text" || typname == "varchar" || typname == "bpchar" || typname == "citext"
	case label:
		return typtype == 'e' || text.accepts(typname, typtype)
	case bytes:
		return typname == "bytea"
	}
	return true
}

// columns are the columns the tailer reads (the decoder from the WAL, the
// join and a resync by query), and what each must be.
var columns = []struct {
	table, column string
	kind          kind
}{
	{"tokens", "id", integer},
	{"tokens", "action", label},
	{"tokens", "secret", bytes},
	{"tokens", "code", text},
	{"tokens", "account", integer},
	{"tokens", "expires_at", integer},
	{"tokens", "consumed_at", anyType},
	{"tokens", "created_at", integer},
	{"accounts", "id", integer},
	{"accounts", "status", label},
	{"accounts", "email", text},
	{"accounts", "login", text},
}

// SchemaError is a schema the tailer cannot read: tables or columns it
// needs that are missing, or of a type it cannot take. It names each, with
// its type and the types that would do.
type SchemaError struct {
	Problems []string
}

func (e *SchemaError) Error() string {
	return "the schema changed in a way the tailer cannot read: " + strings.Join(e.Problems, "; ") +
		". Nothing is published or confirmed until it is changed back; the tailer checks again every few seconds and goes on by itself"
}

// CheckSchema reports whether the tables and columns the tailer reads are
// there in schema, with types it can read, and returns a *SchemaError
// naming each that is not.
func CheckSchema(ctx context.Context, conn Conn, schema pgname.Schema) error {
	rows, err := conn.Query(ctx, `
		SELECT t.name, a.attname, format_type(a.atttypid, a.atttypmod), ty.typname, ty.typtype::text, c.oid IS NOT NULL
		FROM (VALUES ('tokens'), ('accounts')) AS t(name)
		LEFT JOIN pg_class c ON c.oid = to_regclass(format('%I.%I', $1::text, t.name))
		LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
		LEFT JOIN pg_type ty ON ty.oid = a.atttypid`, string(schema))
	if err != nil {
		return fmt.Errorf("read the schema of tokens and accounts: %w", err)
	}
	type col struct{ typ, typname, typtype string }
	have := map[string]col{}
	tables := map[string]bool{}
	for rows.Next() {
		var (
			table             string
			name, typ, tn, tt *string
			exists            bool
		)
		if err := rows.Scan(&table, &name, &typ, &tn, &tt, &exists); err != nil {
			return fmt.Errorf("read the schema of tokens and accounts: %w", err)
		}
		tables[table] = exists
		if name != nil {
			have[table+"."+*name] = col{*typ, *tn, *tt}
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the schema of tokens and accounts: %w", err)
	}
	var problems []string
	for _, want := range columns {
		if !tables[want.table] {
			p := "table " + string(schema) + "." + want.table + " does not exist"
			if len(problems) == 0 || problems[len(problems)-1] != p {
				problems = append(problems, p)
			}
			continue
		}
		c, ok := have[want.table+"."+want.column]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("table %s has no column %s (%s)", want.table, want.column, want.kind))
		case !want.kind.accepts(c.typname, c.typtype[0]):
			problems = append(problems, fmt.Sprintf("table %s, column %s is %s, the tailer reads %s", want.table, want.column, c.typ, want.kind))
		}
	}
	if c, ok := have["tokens.action"]; ok && c.typtype == "e" {
		p, err := unknownActions(ctx, conn, schema)
		if err != nil {
			return err
		}
		problems = append(problems, p...)
	}
	rls, err := rowSecurity(ctx, conn, schema)
	if err != nil {
		return err
	}
	problems = append(problems, rls...)
	if problems != nil {
		return &SchemaError{Problems: problems}
	}
	return nil
}

// rowSecurity names the tables of tokens and accounts whose row-level
// security applies to the connection's role. A policy that hides a row
// from the tailer would have it skip that row's token as deleted, without
// a word; every connection of the tailer sets row_security off
// (pgname.Isolate), so that a query such a policy would filter fails
// instead, and this says which policy and the way out.
func rowSecurity(ctx context.Context, conn Conn, schema pgname.Schema) ([]string, error) {
	rows, err := conn.Query(ctx, `
		SELECT format('%I.%I', n.nspname, c.relname), quote_ident(current_user),
		       coalesce((SELECT string_agg(quote_ident(p.polname), ', ' ORDER BY p.polname) FROM pg_policy p WHERE p.polrelid = c.oid), '')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid IN (to_regclass(format('%I.tokens', $1::text)), to_regclass(format('%I.accounts', $1::text)))
		  AND c.relrowsecurity
		  AND NOT (SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user)
		  AND (c.relforcerowsecurity OR NOT pg_has_role(current_user, c.relowner, 'USAGE'))
		ORDER BY c.relname DESC`, string(schema))
	if err != nil {
		return nil, fmt.Errorf("read the row-level security of tokens and accounts: %w", err)
	}
	var problems []string
	for rows.Next() {
		var table, role, policies string
		if err := rows.Scan(&table, &role, &policies); err != nil {
			return nil, fmt.Errorf("read the row-level security of tokens and accounts: %w", err)
		}
		problems = append(problems, RowSecurityProblem(table, role, policies))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the row-level security of tokens and accounts: %w", err)
	}
	return problems, nil
}

// RowSecurityProblem says that row-level security on table (its
// policies, "" for none) applies to role, and the ways out; table and
// role are quoted as SQL identifiers where they need it.
func RowSecurityProblem(table, role, policies string) string {
	which := "no policy, so every row is hidden"
	if policies != "" {
		which = "policies " + policies
	}
	return fmt.Sprintf("row-level security on %s (%s) applies to role %s, and the tailer does not read through it: a token whose row or account a policy hid would be skipped as deleted, never mailed. "+
		"As a superuser, ALTER ROLE %s BYPASSRLS; or ALTER TABLE %s DISABLE ROW LEVEL SECURITY",
		table, which, role, role, table)
}

// unknownActions names the labels of tokens.action's enum type that are no
// token action the tailer knows: a token of one could be neither signed
// nor handed to a sender, and is no row to skip one by one.
func unknownActions(ctx context.Context, conn Conn, schema pgname.Schema) ([]string, error) {
	rows, err := conn.Query(ctx, `
		SELECT format_type(e.enumtypid, NULL), e.enumlabel
		FROM pg_attribute a JOIN pg_enum e ON e.enumtypid = a.atttypid
		WHERE a.attrelid = to_regclass(format('%I.tokens', $1::text)) AND a.attname = 'action' ORDER BY e.enumsortorder`, string(schema))
	if err != nil {
		return nil, fmt.Errorf("read the labels of tokens.action: %w", err)
	}
	var typ string
	var unknown []string
	for rows.Next() {
		var label string
		if err := rows.Scan(&typ, &label); err != nil {
			return nil, fmt.Errorf("read the labels of tokens.action: %w", err)
		}
		if _, err := action.Parse(label); err != nil {
			unknown = append(unknown, label)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the labels of tokens.action: %w", err)
	}
	if unknown == nil {
		return nil, nil
	}
	return []string{fmt.Sprintf("type %s of tokens.action has value(s) %s that are no token action this tailer knows (%s): run a tailer that knows them, or take them out of the type (a token of one could be neither signed nor mailed)",
		typ, strings.Join(unknown, ", "), strings.Join(action.Labels(), ", "))}, nil
}

// explain turns a failed join into a *SchemaError when the schema is what
// broke it (a column gone or of another type), so that the error names the
// table, the column and the types instead of the query's complaint.
func (j *Joiner) explain(ctx context.Context, err error) error {
	var pgErr *pgconn.PgError
	// Class 42 (undefined column or table, a cast or operator that does not
	// exist) and 0A000 (a cached plan whose result type changed).
	if errors.As(err, &pgErr) && (pgerrcode.IsSyntaxErrororAccessRuleViolation(pgErr.Code) || pgErr.Code == pgerrcode.FeatureNotSupported) && ctx.Err() == nil {
		if serr := CheckSchema(ctx, j.conn, j.schema); serr != nil {
			var schema *SchemaError
			if errors.As(serr, &schema) {
				return fmt.Errorf("%w: %w", ErrJoin, schema)
			}
		}
	}
	return fmt.Errorf("%w: %w", ErrJoin, err)
}

var _ Conn = (*pgx.Conn)(nil)
