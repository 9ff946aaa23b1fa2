-- The triggers insert into tokens and update accounts by name, on the
-- session of whoever inserts an account or consumes a token: they now
-- search this schema alone, whatever that session's search_path is (a
-- schema named after its role, or one a database sets first, would
-- otherwise receive the activation tokens). And the mailroom publication
-- publishes through the root, so that a tokens table made partitioned goes
-- on being read as one. tailer migrate runs this with the search_path set
-- to the schema it migrates alone: current_schema() is that schema.
DO $migration$
DECLARE
    s text := current_schema();
BEGIN
    IF s IS NULL THEN
        RAISE EXCEPTION 'no schema to migrate into (the search_path names none that exists)';
    END IF;
    EXECUTE format('ALTER FUNCTION %I.trg_before_account_insert() SET search_path = %I, pg_temp', s, s);
    EXECUTE format('ALTER FUNCTION %I.trg_before_account_status_change() SET search_path = %I, pg_temp', s, s);
    EXECUTE format('ALTER FUNCTION %I.trg_after_token_consumed() SET search_path = %I, pg_temp', s, s);

    IF EXISTS (SELECT FROM pg_publication WHERE pubname = 'mailroom' AND NOT pubviaroot) THEN
        ALTER PUBLICATION mailroom SET (publish_via_partition_root = true);
    END IF;
END
$migration$;
