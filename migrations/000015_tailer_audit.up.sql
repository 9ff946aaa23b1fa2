-- The audit: audit_missing_count, how many tokens an audit found missing
-- and not yet healed or acknowledged (audit_missing keeps the first
-- thousand ids); tokens_created_at_brin, so that tailer run's audit of
-- the tokens confirmed in the last minute reads those pages alone, not the
-- whole table. A BRIN index is a few pages for millions of rows, and
-- tokens are inserted in about the order of created_at, which is what it
-- needs.
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS audit_missing_count bigint;
CREATE INDEX IF NOT EXISTS tokens_created_at_brin ON tokens USING brin (created_at);
