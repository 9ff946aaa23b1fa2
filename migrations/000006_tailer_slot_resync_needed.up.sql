-- The publication could not carry the tokens table's inserts while the
-- slot existed: pgoutput left the inserts of that time out of the slot's
-- stream, and decoding them again would leave them out again (each change
-- is decoded with the catalog as it was then). Fixing the publication does
-- not bring them back; only a resync does, which clears this with the new
-- incarnation. tailer run does not stream from the slot until then.
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS resync_needed boolean NOT NULL DEFAULT false;
