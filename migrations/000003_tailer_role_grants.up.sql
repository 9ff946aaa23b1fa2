-- The daemon can run as a role of its own with only REPLICATION and these
-- two SELECTs (infra/postgres creates it as "tailer"). The schema's owner
-- runs the migrations; a database without such a role is left alone.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'tailer') THEN
        GRANT SELECT ON tokens, accounts TO tailer;
    END IF;
END
$$;
