REVOKE SELECT (slot, confirmed_through) ON tailer_slot FROM pg_monitor;
ALTER TABLE tailer_slot DROP COLUMN IF EXISTS stopped_msg_id;
ALTER TABLE tailer_slot DROP COLUMN IF EXISTS stopped_seq;
ALTER TABLE tailer_slot DROP COLUMN IF EXISTS confirmed_through;
