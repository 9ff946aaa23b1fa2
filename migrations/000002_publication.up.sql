-- The tailer reads token inserts only: publishing nothing else keeps the
-- walsender from encoding rows nobody reads.
DO $$
BEGIN
    CREATE PUBLICATION mailroom FOR TABLE tokens WITH (publish = 'insert');
EXCEPTION WHEN duplicate_object THEN NULL;
END
$$;
