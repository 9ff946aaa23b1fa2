package pgname

import (
	"errors"

	"github.com/jackc/pgx/v5"
)

// Schema is the name of a schema as configured (MAILROOM_SCHEMA,
// MAILROOM_INBOX_SCHEMA), unquoted.
type Schema string

// Public is the schema the tables are in unless configured otherwise.
const Public Schema = "public"

// Name is schema.name, each part quoted as an SQL identifier.
func (s Schema) Name(name string) string {
	return pgx.Identifier{string(s), name}.Sanitize()
}

// Ident is the schema alone, quoted as an SQL identifier.
func (s Schema) Ident() string { return pgx.Identifier{string(s)}.Sanitize() }

// Literal is the schema as an SQL string literal.
func (s Schema) Literal() string {
	out := []byte{'\''}
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(append(out, '\''))
}

// Check reports whether s can name a schema: not empty, at most 63 bytes
// (PostgreSQL would cut a longer one), no NUL.
func (s Schema) Check() error {
	switch {
	case s == "":
		return errors.New("is empty")
	case len(s) > 63:
		return errors.New("is longer than 63 bytes, which PostgreSQL would cut")
	}
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return errors.New("holds a NUL byte")
		}
	}
	return nil
}

// SearchPath is the search_path of every connection: the system catalog
// alone, so that an unqualified name can only be a built-in one.
const SearchPath = "pg_catalog"

// Isolate sets a connection's run-time parameters (pgx's RuntimeParams) to
// search only SearchPath. A parameter of the startup packet overrides the
// database's and the role's settings and, being applied after them, the
// URL's options=-c search_path=... too.
//
// It also turns row_security off: a query that a row-level security
// policy would filter then fails instead (insufficient privilege), so
// that no row is ever hidden from the tailer or a subscriber without a
// word (a token it cannot see would be taken for deleted).
func Isolate(params map[string]string) {
	params["search_path"] = SearchPath
	params["row_security"] = "off"
}
