package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/mailroom/tailer/internal/pgname"
	"github.com/mailroom/tailer/publish/subscriber"
)

// TokenArgs is the River job of a token: one job a token, unique by its
// token key, so that inserting it again (a message delivered again) adds
// nothing. A worker that mails it gives the token key to the mail
// provider as the idempotency key: a job retried after a send whose
// answer was lost is then sent once.
type TokenArgs struct {
	TokenKey  string `json:"token_key" river:"unique"`
	TokenID   int64  `json:"token_id"`
	Action    string `json:"action"`
	Email     string `json:"email"`
	Login     string `json:"login"`
	Token     string `json:"token"`
	Code      string `json:"code"`
	ExpiresAt int64  `json:"expires_at,omitempty"`
	KeyID     string `json:"key_id,omitempty"`
	BatchID   string `json:"batch_id"`
	Line      int    `json:"line"`
	Stream    string `json:"stream"`
	StreamSeq uint64 `json:"stream_seq"`
	// Durable names the consumer that stored it (empty from a service's
	// own).
	Durable string `json:"durable,omitempty"`
}

// Kind is the River job kind of a token.
func (TokenArgs) Kind() string { return "mailroom_token" }

// InsertOpts makes the job unique by token key, in River's default unique
// states: a job for a token that is still to run, running, or completed
// and not yet cleaned out (River keeps completed jobs 24 hours by default)
// is not inserted again.
func (TokenArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

// Jobs stores tokens as River jobs (TokenArgs), through an insert-only
// River client.
type Jobs struct {
	client *river.Client[pgx.Tx]
	schema pgname.Schema
}

// NewJobs returns a Jobs sink for River's tables in schema ("" is
// public), which must be there (MigrateRiver).
func NewJobs(schema pgname.Schema) (*Jobs, error) {
	schema = orPublic(schema)
	client, err := river.NewClient(riverpgxv5.New(nil), &river.Config{Schema: string(schema)})
	if err != nil {
		return nil, fmt.Errorf("river client: %w", err)
	}
	return &Jobs{client: client, schema: schema}, nil
}

// Position is the last stream sequence of a token among durable's River
// jobs of kind mailroom_token (completed jobs River has cleaned out do not
// count).
func (j *Jobs) Position(ctx context.Context, pool *pgxpool.Pool, stream, durable string) (subscriber.Stored, bool, error) {
	return position(ctx, pool, `SELECT (args->>'stream_seq')::bigint, args->>'batch_id', args->>'token_key' FROM `+j.schema.Name("river_job")+`
		WHERE kind = 'mailroom_token' AND args->>'stream' = $1 AND args->>'durable' = $2
		ORDER BY (args->>'stream_seq')::bigint DESC LIMIT 1`, stream, durable)
}

// Holds reports whether durable stored a River job of a token of the
// message at seq of stream with id batchID (one River has cleaned out
// does not count). Asked by containment, which River's index of args
// serves.
func (j *Jobs) Holds(ctx context.Context, pool *pgxpool.Pool, stream, durable string, seq uint64, batchID string) (bool, error) {
	return holds(ctx, pool, `SELECT EXISTS (SELECT 1 FROM `+j.schema.Name("river_job")+`
		WHERE kind = 'mailroom_token' AND args @> jsonb_build_object('stream', $1::text, 'durable', $2::text, 'stream_seq', $3::bigint, 'batch_id', $4::text))`, stream, durable, seq, batchID)
}

// Store inserts a job for each of b's tokens, those whose job is there
// already left alone.
//
// It first tries River's COPY insert in a savepoint: in a drain it takes
// about three quarters of the time of the insert that passes over jobs
// already there, which COPY cannot do (a unique conflict fails it whole).
// A message whose tokens are there in part or in full (delivered again)
// is rolled back to the savepoint and takes that insert.
func (j *Jobs) Store(ctx context.Context, tx pgx.Tx, m Meta, b *subscriber.Decoded) (int, error) {
	added, err := j.StoreAll(ctx, tx, b.Units(m.Stream, m.Seq, m.Durable))
	return sum(added), err
}

// StoreAll is Store for units of several messages, in one COPY when none
// of their tokens' jobs is there.
func (j *Jobs) StoreAll(ctx context.Context, tx pgx.Tx, us []*subscriber.Unit) ([]int, error) {
	params := JobParams(us...)
	added := make([]int, len(us))
	_, err := j.copyNew(ctx, tx, params)
	if err == nil {
		for i, u := range us {
			added[i] = len(u.Tokens)
		}
		return added, nil
	}
	if !errors.Is(err, errStoredBefore) {
		return nil, err
	}
	// A key twice among them (two deliveries of a message at hand) is
	// one job, of the first: River's insert takes a key once.
	unitOf := map[string]int{}
	var once []river.InsertManyParams
	k := 0
	for i, u := range us {
		for _, t := range u.Tokens {
			if _, ok := unitOf[t.Key]; !ok {
				unitOf[t.Key] = i
				once = append(once, params[k])
			}
			k++
		}
	}
	res, err := j.client.InsertManyTx(ctx, tx, once)
	if err != nil {
		return nil, fmt.Errorf("insert River jobs: %w", err)
	}
	for _, r := range res {
		if r.UniqueSkippedAsDuplicate {
			continue
		}
		var args TokenArgs
		if err := json.Unmarshal(r.Job.EncodedArgs, &args); err != nil {
			return nil, fmt.Errorf("a River job inserted: %w", err)
		}
		added[unitOf[args.TokenKey]]++
	}
	return added, nil
}

// JobParams are the jobs StoreAll inserts for the tokens of us: for a
// service that inserts them with River itself.
func JobParams(us ...*subscriber.Unit) []river.InsertManyParams {
	var params []river.InsertManyParams
	for _, u := range us {
		for _, t := range u.Tokens {
			args := TokenArgs{
				TokenKey: t.Key, TokenID: t.ID, Action: t.Action, Email: t.Email, Login: t.Login, Token: t.Token, Code: t.Code,
				ExpiresAt: t.ExpiresAt, KeyID: u.KeyID, BatchID: u.ID, Line: u.Line, Stream: u.Stream, StreamSeq: u.Seq, Durable: u.Durable,
			}
			params = append(params, river.InsertManyParams{Args: args, InsertOpts: traceOpts(args, t.Traceparent)})
		}
	}
	return params
}

// traceOpts gives a traced token's job its traceparent in River's job
// metadata ({"traceparent": ...}), where the worker continues the trace;
// untraced tokens keep the args' own options. The traceparent is one a
// consumer validated (subscriber.Decode), so it needs no escaping.
func traceOpts(args TokenArgs, traceparent string) *river.InsertOpts {
	if traceparent == "" {
		return nil
	}
	opts := args.InsertOpts()
	opts.Metadata = []byte(`{"traceparent":"` + traceparent + `"}`)
	return &opts
}

// copyNew inserts params by COPY in a savepoint of tx, rolled back when a
// job of theirs is there (errStoredBefore).
func (j *Jobs) copyNew(ctx context.Context, tx pgx.Tx, params []river.InsertManyParams) (int, error) {
	n, err := inSavepoint(ctx, tx, "river_job_unique_idx", func(sp pgx.Tx) (int, error) { return j.client.InsertManyFastTx(ctx, sp, params) })
	if err != nil && !errors.Is(err, errStoredBefore) {
		return 0, fmt.Errorf("insert River jobs: %w", err)
	}
	return n, err
}

// MigrateRiver applies River's own migrations to schema ("" is public;
// made if missing) of the database of pool (what `river migrate-up`
// does).
func MigrateRiver(ctx context.Context, pool *pgxpool.Pool, schema pgname.Schema) error {
	schema = orPublic(schema)
	if err := ensureSchema(ctx, pool, schema); err != nil {
		return err
	}
	m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: string(schema)})
	if err != nil {
		return fmt.Errorf("migrate River: %w", err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrate River: %w", err)
	}
	return nil
}
