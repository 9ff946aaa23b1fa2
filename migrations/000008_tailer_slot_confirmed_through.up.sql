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
