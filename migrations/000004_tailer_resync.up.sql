-- One row per slot that `tailer resync` (or `tailer migrate` adopting a
-- collector's database) recreated from a snapshot. Until done_at is set the
-- snapshot's tokens are not all on the stream, and `tailer run` must not
-- stream from the slot: a resync killed half way is finished by running it
-- again. Once done, stream_seq is the stream's last sequence at the end of
-- the resync: the positions of messages up to it describe the old slot (or
-- another database), not this one.
CREATE TABLE IF NOT EXISTS tailer_resync (
    slot             text PRIMARY KEY,
    -- The collector's jobs.last_seq when adopting: only tokens after it.
    after_id         bigint,
    started_at       timestamptz NOT NULL DEFAULT now(),
    consistent_point pg_lsn,
    stream_seq       bigint,
    done_at          timestamptz
);

DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'tailer') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON tailer_resync TO tailer;
    END IF;
END
$$;
