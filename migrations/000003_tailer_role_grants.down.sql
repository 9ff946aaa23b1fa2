DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'tailer') THEN
        REVOKE SELECT ON tokens, accounts FROM tailer;
    END IF;
END
$$;
