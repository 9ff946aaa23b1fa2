ALTER TABLE tailer_slot DROP COLUMN IF EXISTS resync_needed;
