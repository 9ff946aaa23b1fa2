-- What the stream held when a tailer of the slot's incarnation last
-- looked at it (JetStream's first and last sequences, and how many
-- messages within them were gone), written with the anchor. On a stream
-- whose configuration removes no message, a tailer started after another
-- was killed compares the stream with it: a first sequence moved on or
-- more messages gone were purged or deleted while no tailer looked, even
-- when the anchor itself is still there. Null until a tailer looked, and
-- after a resync's new incarnation until it did.
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS seen_first bigint;
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS seen_last bigint;
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS seen_deleted bigint;
