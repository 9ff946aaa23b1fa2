-- Which publication each slot's tailer reads tokens through, and a check of
-- it that the tailer (replication.CheckPublication, tailer status) and the
-- publication guard share.
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS publication text;

-- The stream the slot's incarnation publishes to, and when the NATS server
-- created it (RFC 3339, as JetStream reports it): a stream of that name
-- created at another time was deleted and made again, and what the old one
-- held is gone, acknowledged or not.
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS stream_name text;
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS stream_created text;

-- What keeps publication pub from carrying every insert into tokens (the
-- table the search path finds) with the columns the tailer reads, or NULL.
-- pgoutput leaves out, without a word, the inserts of a table the
-- publication does not hold, does not publish inserts of, or filters out
-- with a row filter, and sends only the columns of a column list.
--
-- It reads the publication catalogs themselves, in the calling statement's
-- one snapshot (a STABLE function), rather than pg_publication_tables: that
-- view looks each publication up again by name in the catalog snapshot of
-- the moment, so a check running as a publication is dropped and made
-- again in one transaction found the old row and no tables for it. The
-- rules are pg_publication_tables': a partition is published under its own
-- name, through a table or schema it or an ancestor is in, unless the
-- publication publishes through the root.
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

-- The publication guard: run at the end of every command that can change
-- what a publication carries (tailer migrate installs it as an event
-- trigger where the role may), it marks each slot whose publication can no
-- longer carry token inserts as needing a resync, in the same transaction
-- as the change. Without it the tailer checks only every
-- MAILROOM_LAG_INTERVAL, and a publication changed and changed back
-- between two checks leaves inserts out of the slot's stream unseen.
-- It runs as its owner, who owns tailer_slot: whoever changes a
-- publication may not write to it.
CREATE OR REPLACE FUNCTION tailer_publication_guard() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE tailer_slot SET resync_needed = true
    WHERE publication IS NOT NULL AND NOT resync_needed AND tailer_publication_problem(publication) IS NOT NULL;
END
$$;
REVOKE ALL ON FUNCTION tailer_publication_guard() FROM PUBLIC;
