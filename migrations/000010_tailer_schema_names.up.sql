-- The check of a publication and the publication guard name the schema
-- of every table they look at, never finding one by the search_path.
-- PostgreSQL's default search_path puts a schema named after the
-- session's role before public, and a database or role can set its own: a
-- table tokens there would have been checked in place of this schema's.
-- tailer migrate runs every migration with the search_path set to the
-- schema it migrates (MAILROOM_SCHEMA) alone, so current_schema() below
-- is that schema.
--
-- tailer_publication_problem takes the schema of the tokens table it
-- checks, and refuses a partitioned tokens table that a publication does
-- not publish through its root: pgoutput sends its inserts under the
-- partitions' names, which are no tokens table to the tailer.
DO $migration$
DECLARE
    s text := current_schema();
BEGIN
    IF s IS NULL THEN
        RAISE EXCEPTION 'no schema to migrate into (the search_path names none that exists)';
    END IF;

    -- The rules are pg_publication_tables': a partition is published
    -- under its own name, through a table or schema it or an ancestor is
    -- in, unless the publication publishes through the root; a
    -- partitioned table's inserts are those of its partitions.
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %I.tailer_publication_problem(pub text, tokens_schema text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    p    pg_publication;
    t    oid := to_regclass(format('%%I.tokens', tokens_schema));
    kind "char";
    rel  record;
BEGIN
    SELECT * INTO p FROM pg_publication WHERE pubname = pub;
    IF NOT FOUND THEN
        RETURN 'does not exist';
    END IF;
    IF t IS NULL THEN
        RETURN 'does not include the tokens table (there is no table ' || quote_ident(tokens_schema) || '.tokens)';
    END IF;
    IF (p.pubviaroot AND (SELECT relispartition FROM pg_class WHERE oid = t)) OR NOT (
        p.puballtables
        OR EXISTS (SELECT FROM pg_publication_rel r
            WHERE r.prpubid = p.oid AND r.prrelid IN (SELECT t UNION SELECT relid FROM pg_partition_ancestors(t)))
        OR EXISTS (SELECT FROM pg_publication_namespace n JOIN pg_class c ON c.relnamespace = n.pnnspid
            WHERE n.pnpubid = p.oid AND c.oid IN (SELECT t UNION SELECT relid FROM pg_partition_ancestors(t)))) THEN
        RETURN 'does not include the tokens table ' || quote_ident(tokens_schema) || '.tokens';
    END IF;
    SELECT relkind INTO kind FROM pg_class WHERE oid = t;
    IF kind = 'p' AND NOT p.pubviaroot THEN
        RETURN 'publishes the partitioned tokens table''s inserts under the names of its partitions, which the tailer does not read as tokens '
            || '(ALTER PUBLICATION ' || quote_ident(pub) || ' SET (publish_via_partition_root = true))';
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
$body$
$f$, s);

    -- Runs as its owner, who owns tailer_slot: whoever changes a
    -- publication may not write to it.
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.tailer_publication_guard() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
BEGIN
    UPDATE %1$I.tailer_slot SET resync_needed = true
    WHERE publication IS NOT NULL AND NOT resync_needed AND %1$I.tailer_publication_problem(publication, %2$L) IS NOT NULL;
END
$body$
$f$, s, s);

    EXECUTE format('DROP FUNCTION IF EXISTS %I.tailer_publication_problem(text)', s);

END
$migration$;
