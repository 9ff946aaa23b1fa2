-- Where each durable consumer's messages are stored through: every
-- message it was given at or before stream_seq is stored (the loop's
-- transactions commit in any order; each writes, with its tokens, the
-- newest such message it knows of). A consumer the server lost is made
-- again there. batch_id (the message's Nats-Msg-Id) and token_key (one of
-- its token keys) say which message that was, so that a stream made
-- again, whose sequence names another message, is not taken for it.
CREATE TABLE IF NOT EXISTS mailroom_stored_through (
    stream     text NOT NULL,
    durable    text NOT NULL,
    stream_seq bigint NOT NULL,
    batch_id   text NOT NULL,
    token_key  text NOT NULL,
    stored_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS mailroom_stored_through_seq ON mailroom_stored_through (stream, durable, stream_seq);
