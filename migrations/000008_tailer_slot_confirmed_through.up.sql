-- How far the slot's confirmed position reaches in time, as the tailer
-- that holds it last knew: every token committed before confirmed_through
-- is published and confirmed. tailer status shows now() minus it as the
-- lag in seconds; it keeps growing while no holder moves it (a frozen or
-- stopped tailer), which is what an operator asking "how far behind"
-- needs to see.
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS confirmed_through timestamptz;

-- For postgres_exporter (pg_monitor): the lag in seconds seen from
-- PostgreSQL's side, which keeps growing while no tailer runs at all
-- (infra/postgres-exporter/queries.yaml).
GRANT SELECT (slot, confirmed_through) ON tailer_slot TO pg_monitor;

-- Where the stream stood when tailer run last stopped cleanly: its last
-- sequence and that message's id, read from the stream once the pipeline
-- had drained. Cleared when a session starts, so only a clean stop after
-- the last session leaves it. A stream made again with the same messages
-- (restored from a backup taken after that stop, as a move to a cluster
-- does) holds that message at that sequence, and is taken for the same.
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS stopped_seq bigint;
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS stopped_msg_id text;
