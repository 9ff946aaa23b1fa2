CREATE TABLE IF NOT EXISTS tailer_resync (
    slot             text PRIMARY KEY,
    after_id         bigint,
    started_at       timestamptz NOT NULL DEFAULT now(),
    consistent_point pg_lsn,
    stream_seq       bigint,
    done_at          timestamptz
);

INSERT INTO tailer_resync (slot, after_id, started_at, consistent_point, stream_seq, done_at)
SELECT slot, collector_last_seq, created_at, consistent_point, stream_seq,
       CASE WHEN resync_pending THEN NULL ELSE now() END
FROM tailer_slot
WHERE resync_pending OR consistent_point IS NOT NULL
ON CONFLICT (slot) DO NOTHING;

DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'tailer') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON tailer_resync TO tailer;
    END IF;
END
$$;

DROP TABLE IF EXISTS tailer_slot;
