-- Back to migration 9's functions, found by the search_path.
DO $migration$
DECLARE
    s text := current_schema();
BEGIN
    EXECUTE format('DROP FUNCTION IF EXISTS %I.tailer_publication_problem(text, text)', s);
END
$migration$;

CREATE OR REPLACE FUNCTION tailer_publication_problem(pub text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    p   pg_publication;
    t   oid := to_regclass('tokens');
    rel record;
BEGIN
    SELECT * INTO p FROM pg_publication WHERE pubname = pub;
    IF NOT FOUND THEN
        RETURN 'does not exist';
    END IF;
    IF t IS NULL OR (p.pubviaroot AND (SELECT relispartition FROM pg_class WHERE oid = t)) OR NOT (
        p.puballtables
        OR EXISTS (SELECT FROM pg_publication_rel r
            WHERE r.prpubid = p.oid AND r.prrelid IN (SELECT t UNION SELECT relid FROM pg_partition_ancestors(t)))
        OR EXISTS (SELECT FROM pg_publication_namespace n JOIN pg_class c ON c.relnamespace = n.pnnspid
            WHERE n.pnpubid = p.oid AND c.oid IN (SELECT t UNION SELECT relid FROM pg_partition_ancestors(t)))) THEN
        RETURN 'does not include the tokens table';
    END IF;
    IF NOT p.pubinsert THEN
        RETURN 'does not publish inserts (publish = ''insert'')';
    END IF;
    FOR rel IN SELECT r.prrelid, r.prqual, r.prattrs FROM pg_publication_rel r
        WHERE r.prpubid = p.oid AND r.prrelid IN (SELECT t UNION SELECT relid FROM pg_partition_ancestors(t))
    LOOP
        IF rel.prqual IS NOT NULL THEN
            RETURN 'filters the tokens table''s rows (a row filter, WHERE ' || pg_get_expr(rel.prqual, rel.prrelid) ||
                '), and the inserts it filters out never reach the tailer';
        END IF;
        IF rel.prattrs IS NOT NULL AND EXISTS (
            SELECT FROM unnest(ARRAY['id', 'action', 'secret', 'code', 'account']) AS col(name)
            WHERE NOT EXISTS (SELECT FROM pg_attribute a
                WHERE a.attrelid = rel.prrelid AND a.attname = col.name AND a.attnum = ANY (rel.prattrs::int2[]))) THEN
            RETURN 'publishes a column list of the tokens table without every column the tailer reads (id, action, secret, code, account)';
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION tailer_publication_guard() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE tailer_slot SET resync_needed = true
    WHERE publication IS NOT NULL AND NOT resync_needed AND tailer_publication_problem(publication) IS NOT NULL;
END
$$;
