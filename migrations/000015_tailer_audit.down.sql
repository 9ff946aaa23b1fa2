DROP INDEX IF EXISTS tokens_created_at_brin;
ALTER TABLE tailer_slot DROP COLUMN IF EXISTS audit_missing_count;
