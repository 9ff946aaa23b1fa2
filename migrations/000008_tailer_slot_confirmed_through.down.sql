ALTER TABLE tailer_slot DROP COLUMN IF EXISTS confirmed_through;
