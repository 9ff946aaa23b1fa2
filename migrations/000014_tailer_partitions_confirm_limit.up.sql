-- Rows that enter tokens without an insert: a table attached as a
-- partition of tokens (or of one of its partitions) while it holds rows,
-- a partition detached (concurrently or not) and attached again with the
-- rows written to it meanwhile. The slot's stream carries no insert of
-- them, so the publication guard marks the slot for a resync, saying why
-- (resync_cause), in the transaction of the attach. It knows a partition
-- is new by tailer_partitions, the partitions of tokens it saw last: one
-- made with CREATE TABLE ... PARTITION OF is seen empty as it is made, and
-- the inserts into it afterwards reach the slot as any other.
--
-- confirm_limit is the furthest position a tailer of the slot's
-- incarnation may have confirmed to it, written before the tailer
-- confirms past it. A slot confirmed further was advanced by someone
-- else (a tailer of another schema configured with the same slot, or by
-- hand), and the tokens committed in between never reached this stream.
-- NULL until a tailer wrote it.
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS confirm_limit pg_lsn;
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS resync_cause text;

-- With what the stream held (seen_*): how many of its messages were
-- batches, whether its configuration then removed old messages (and the
-- most messages it kept, when a limit of messages alone did), and
-- whether no message of the tailer's was on its way then (a clean stop).
-- A stream whose configuration removes nothing and that holds as many
-- batches as then, those stored since added, lost none, whatever else is
-- gone (the session markers' subject purged); a limit taken off after it
-- removed messages is no purge.
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS seen_batches bigint;
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS seen_trims boolean;
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS seen_keeps bigint;
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS seen_quiet boolean;

-- The audit (tailer audit, and tailer run's own): heal_asked_at, when a
-- tailer audit --heal asked a streaming tailer run to let go of the
-- slot's lease for a while; audit_missing, the ids of the tokens an
-- audit found missing from the stream and not yet healed or acknowledged
-- (for /readyz and tailer status), since audit_missing_at; audit_through,
-- how far tailer run's audit got (the tokens created before it are
-- audited).
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS heal_asked_at timestamptz;
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS audit_missing text;
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS audit_missing_at timestamptz;
ALTER TABLE tailer_slot ADD COLUMN IF NOT EXISTS audit_through timestamptz;

CREATE TABLE IF NOT EXISTS tailer_partitions (relid oid PRIMARY KEY);

DO $migration$
DECLARE
    s text := current_schema();
BEGIN
    IF s IS NULL THEN
        RAISE EXCEPTION 'no schema to migrate into (the search_path names none that exists)';
    END IF;

    EXECUTE format($f$
INSERT INTO %1$I.tailer_partitions
SELECT relid FROM pg_partition_tree(to_regclass(%2$L)) WHERE level > 0
ON CONFLICT DO NOTHING
$f$, s, format('%I.tokens', s));

    -- Runs as its owner, who owns tailer_slot and tailer_partitions:
    -- whoever changes a publication or attaches a table may not write
    -- to them.
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.tailer_publication_guard() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    t    oid := to_regclass(%3$L);
    p    record;
    rows boolean;
BEGIN
    UPDATE %1$I.tailer_slot SET resync_needed = true
    WHERE publication IS NOT NULL AND NOT resync_needed AND %1$I.tailer_publication_problem(publication, %2$L) IS NOT NULL;
    IF t IS NULL THEN
        RETURN;
    END IF;
    FOR p IN SELECT tree.relid, c.relkind FROM pg_partition_tree(t) tree JOIN pg_class c ON c.oid = tree.relid
        WHERE tree.level > 0 AND tree.relid NOT IN (SELECT relid FROM %1$I.tailer_partitions)
    LOOP
        INSERT INTO %1$I.tailer_partitions VALUES (p.relid);
        IF p.relkind = 'r' THEN
            EXECUTE format('SELECT EXISTS (SELECT FROM ONLY %%s)', p.relid::regclass) INTO rows;
            IF rows THEN
                UPDATE %1$I.tailer_slot SET resync_needed = true, resync_cause = format(
                    'table %%s was attached to %%s holding rows, which entered it without an insert the slot could carry', p.relid::regclass, t::regclass)
                WHERE publication IS NOT NULL AND NOT resync_needed;
            END IF;
        END IF;
    END LOOP;
    DELETE FROM %1$I.tailer_partitions WHERE relid NOT IN (SELECT relid FROM pg_partition_tree(t) WHERE level > 0);
END
$body$
$f$, s, s, format('%I.tokens', s));
END
$migration$;
