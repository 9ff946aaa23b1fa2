ALTER TABLE tailer_slot DROP COLUMN IF EXISTS refused_at;
ALTER TABLE tailer_slot DROP COLUMN IF EXISTS refused;
ALTER TABLE tailer_slot DROP COLUMN IF EXISTS refused_fact;
