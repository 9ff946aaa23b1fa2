ALTER TABLE tailer_slot DROP COLUMN IF EXISTS seen_deleted;
ALTER TABLE tailer_slot DROP COLUMN IF EXISTS seen_last;
ALTER TABLE tailer_slot DROP COLUMN IF EXISTS seen_first;
