REVOKE SELECT (slot, confirmed_through) ON tailer_slot FROM pg_monitor;
ALTER TABLE tailer_slot DROP COLUMN IF EXISTS confirmed_through;
