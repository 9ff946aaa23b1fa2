ALTER TABLE tailer_slot DROP COLUMN IF EXISTS anchor_mark;
ALTER TABLE tailer_slot DROP COLUMN IF EXISTS anchor_seq;
