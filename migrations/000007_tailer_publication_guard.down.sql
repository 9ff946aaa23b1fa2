-- The event triggers that run this schema's guard, by their function:
-- each schema of a database has its own, whatever its name.
DO $$
DECLARE
    e record;
BEGIN
    FOR e IN SELECT evtname FROM pg_event_trigger
        WHERE evtfoid = to_regprocedure(format('%I.tailer_publication_guard()', current_schema()))
    LOOP
        EXECUTE format('DROP EVENT TRIGGER %I', e.evtname);
    END LOOP;
END
$$;
DROP FUNCTION IF EXISTS tailer_publication_guard();
DROP FUNCTION IF EXISTS tailer_publication_problem(text);
ALTER TABLE tailer_slot DROP COLUMN IF EXISTS publication, DROP COLUMN IF EXISTS stream_name, DROP COLUMN IF EXISTS stream_created;
