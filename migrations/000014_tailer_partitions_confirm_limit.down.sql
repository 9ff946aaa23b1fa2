-- The guard of migration 10.
DO $migration$
DECLARE
    s text := current_schema();
BEGIN
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.tailer_publication_guard() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
BEGIN
    UPDATE %1$I.tailer_slot SET resync_needed = true
    WHERE publication IS NOT NULL AND NOT resync_needed AND %1$I.tailer_publication_problem(publication, %2$L) IS NOT NULL;
END
$body$
$f$, s, s);
END
$migration$;
DROP TABLE IF EXISTS tailer_partitions;
ALTER TABLE tailer_slot DROP COLUMN IF EXISTS resync_cause;
ALTER TABLE tailer_slot DROP COLUMN IF EXISTS heal_asked_at;
ALTER TABLE tailer_slot DROP COLUMN IF EXISTS audit_missing;
ALTER TABLE tailer_slot DROP COLUMN IF EXISTS audit_missing_at;
ALTER TABLE tailer_slot DROP COLUMN IF EXISTS audit_through;
ALTER TABLE tailer_slot DROP COLUMN IF EXISTS seen_quiet;
ALTER TABLE tailer_slot DROP COLUMN IF EXISTS seen_keeps;
ALTER TABLE tailer_slot DROP COLUMN IF EXISTS seen_trims;
ALTER TABLE tailer_slot DROP COLUMN IF EXISTS seen_batches;
ALTER TABLE tailer_slot DROP COLUMN IF EXISTS confirm_limit;
