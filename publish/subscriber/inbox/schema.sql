-- The transactional inbox tailer subscribe writes tokens into: one row a
-- token, keyed by its token key (never reused), stored in the same
-- transaction for every token of a message, which is acknowledged to
-- JetStream only after the commit. A message delivered again (a crash
-- between the commit and the ack, a lost ack) inserts nothing twice.
-- The service that mails the tokens works the rows in its own
-- transactions: processed_at once sent, attempts and last_error to bound
-- its retries.
--
-- inbox.Migrate runs this whole in one transaction; a later change is a
-- statement added below that can run again (ADD COLUMN IF NOT EXISTS).
CREATE TABLE IF NOT EXISTS mailroom_inbox (
    token_key    text PRIMARY KEY,
    token_id     bigint NOT NULL,
    action       text NOT NULL,
    email        text NOT NULL,
    login        text NOT NULL,
    token        text NOT NULL,
    code         text NOT NULL,
    -- Carried by json batches only.
    expires_at   bigint,
    -- The signing key's id (Mailroom-Key-Id), the message's id, the line
    -- (batch) of the message the token was in, and where the message is on
    -- the stream.
    key_id       text,
    batch_id     text NOT NULL,
    line         integer NOT NULL,
    stream       text NOT NULL,
    stream_seq   bigint NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now(),
    processed_at timestamptz,
    attempts     integer NOT NULL DEFAULT 0,
    last_error   text
);

CREATE INDEX IF NOT EXISTS mailroom_inbox_unprocessed ON mailroom_inbox (received_at) WHERE processed_at IS NULL;

-- The durable consumer that stored the row (NULL: a service's own): where
-- it got to, should the server lose it.
ALTER TABLE mailroom_inbox ADD COLUMN IF NOT EXISTS durable text;
CREATE INDEX IF NOT EXISTS mailroom_inbox_durable_seq ON mailroom_inbox (stream, durable, stream_seq);

-- The W3C traceparent the token's transaction carried (the message's
-- traceparent headers), for the service to continue the trace: NULL when
-- it carried none.
ALTER TABLE mailroom_inbox ADD COLUMN IF NOT EXISTS traceparent text;
