-- The triggers back on their callers' search_path; the publication keeps
-- publishing through the root (it changes nothing for a table that is not
-- partitioned, and a partitioned one needs it).
DO $migration$
DECLARE
    s text := current_schema();
BEGIN
    EXECUTE format('ALTER FUNCTION %I.trg_before_account_insert() RESET search_path', s);
    EXECUTE format('ALTER FUNCTION %I.trg_before_account_status_change() RESET search_path', s);
    EXECUTE format('ALTER FUNCTION %I.trg_after_token_consumed() RESET search_path', s);
END
$migration$;
