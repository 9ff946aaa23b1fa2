-- One row per slot the tailer owns: who made the slot, its incarnation,
-- and what of the stream belongs to it. Replaces tailer_resync.
--
-- incarnation is new every time a tailer command creates the slot (tailer
-- migrate, tailer run, tailer resync) and goes on every batch published
-- from it. A copy or restore of the database copies this row but not the
-- slot, so the slot it gets next has another incarnation, and the stream's
-- batches of the original are never taken for its own.
CREATE TABLE IF NOT EXISTS tailer_slot (
    slot               text PRIMARY KEY,
    incarnation        text NOT NULL,
    created_by         text NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    -- A resync made the slot and has not published all of its snapshot:
    -- tailer run must not stream from it until a resync finishes.
    resync_pending     boolean NOT NULL DEFAULT false,
    consistent_point   pg_lsn,
    -- The stream's last sequence when this incarnation took the stream
    -- over: messages up to it belong to earlier slots, every later one to
    -- this one. NULL until a tailer has looked at the stream.
    stream_seq         bigint,
    -- The slot predates incarnations (made before this migration): its
    -- batches without an incarnation are its own.
    legacy             boolean NOT NULL DEFAULT false,
    -- mailroom's collector's jobs.last_seq and the time (epoch seconds) of
    -- the cutover: tokens up to that id created before then were sent by
    -- the collector, and no resync publishes them again.
    collector_last_seq bigint,
    collector_cutover  bigint,
    -- Why tailer run cannot stream from the slot until the operator acts
    -- (NULL while it can), for tailer status.
    blocked            text,
    blocked_at         timestamptz
);

-- What tailer_resync knew, then the slots that predate this migration.
DO $$
BEGIN
    IF to_regclass('tailer_resync') IS NOT NULL THEN
        INSERT INTO tailer_slot (slot, incarnation, created_by, created_at, resync_pending, consistent_point,
                                 stream_seq, legacy, collector_last_seq, collector_cutover)
        SELECT r.slot, replace(gen_random_uuid()::text, '-', ''), 'resync', r.started_at, r.done_at IS NULL,
               r.consistent_point, r.stream_seq, true, r.after_id,
               CASE WHEN r.after_id IS NOT NULL THEN extract(epoch FROM r.started_at)::bigint END
        FROM tailer_resync r
        ON CONFLICT (slot) DO NOTHING;
        DROP TABLE tailer_resync;
    END IF;
END
$$;

-- Only where no other schema of the database has a tailer_slot: there, the
-- slots are that schema's tailer's (a tailer from before incarnations had
-- no such table anywhere), and a second mailroom schema adopting them
-- would stream them through its own publication.
INSERT INTO tailer_slot (slot, incarnation, created_by, stream_seq, legacy)
SELECT slot_name, replace(gen_random_uuid()::text, '-', ''), 'unknown (before incarnations)', 0, true
FROM pg_replication_slots
WHERE database = current_database() AND plugin = 'pgoutput' AND slot_type = 'logical'
  AND NOT EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                  WHERE c.relname = 'tailer_slot' AND n.nspname <> current_schema())
ON CONFLICT (slot) DO NOTHING;

DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'tailer') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON tailer_slot TO tailer;
    END IF;
END
$$;
