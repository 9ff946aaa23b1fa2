DROP EVENT TRIGGER IF EXISTS tailer_publication_guard;
DROP FUNCTION IF EXISTS tailer_publication_guard();
DROP FUNCTION IF EXISTS tailer_publication_problem(text);
ALTER TABLE tailer_slot DROP COLUMN IF EXISTS publication, DROP COLUMN IF EXISTS stream_name, DROP COLUMN IF EXISTS stream_created;
