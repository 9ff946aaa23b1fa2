-- A refusal that lasts: the stream lost batches JetStream had acknowledged
-- to the slot's incarnation (deleted and made again, purged, a message
-- deleted, trimmed by its limits under a replay). No later look at the
-- stream can say they came back (a session's own end changes what the
-- next one sees, markers go on over the gap), so the first tailer that
-- finds it records it here, and every tailer after it refuses the slot
-- until the way out is taken: tailer resync, whose new incarnation clears
-- it. refused_fact names the fact (publish/relay.Fact), refused the
-- words it was said with.
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS refused_fact text;
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS refused text;
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS refused_at timestamptz;
