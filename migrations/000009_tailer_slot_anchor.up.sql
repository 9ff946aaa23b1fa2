-- The newest batch the slot's incarnation stored on the stream, as the
-- tailer last found it there: its sequence and its mark (its Nats-Msg-Id,
-- see publish/wire.Mark). A tailer started after another was killed takes
-- it as an anchor: the stream is the one it published to while it holds
-- that message at that sequence, whichever replica answers and whatever
-- creation time it reports, and a stream purged (of the batches' subject
-- alone too), made again or restored from an older backup while no tailer
-- ran does not hold it. Cleared with the incarnation (tailer resync).
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS anchor_seq bigint;
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS anchor_mark text;
