-- The mailroom schema: accounts, tokens and their lifecycle triggers.
-- Written to also adopt a database that already ran mailroom's own
-- migration (the collector's), so every statement tolerates existing objects.

CREATE EXTENSION IF NOT EXISTS pgcrypto;

-- pgcrypto may have been installed before, in another schema than this one
-- (public, or a schema of extensions): tokens.secret's default,
-- gen_random_bytes, is looked up there. The default keeps the function
-- itself, not its name, so no session's search_path matters later.
SELECT set_config('search_path', format('%I, %I, pg_temp', current_schema(), n.nspname), false)
FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
WHERE e.extname = 'pgcrypto';

DO $$
BEGIN
    CREATE TYPE account_status AS ENUM ('provisioned', 'active', 'suspended');
EXCEPTION WHEN duplicate_object THEN NULL;
END
$$;

DO $$
BEGIN
    CREATE TYPE token_action AS ENUM ('activation', 'password_recovery');
EXCEPTION WHEN duplicate_object THEN NULL;
END
$$;

CREATE TABLE IF NOT EXISTS accounts (
    id                  BIGSERIAL PRIMARY KEY,
    email               VARCHAR(254) UNIQUE NOT NULL,
    status              account_status DEFAULT 'provisioned' NOT NULL,
    login               VARCHAR(254) UNIQUE NOT NULL,
    created_at          INTEGER DEFAULT EXTRACT(EPOCH FROM NOW()) NOT NULL,
    status_changed_at   INTEGER,
    activated_at        INTEGER,
    suspended_at        INTEGER,
    unsuspended_at      INTEGER
);

CREATE TABLE IF NOT EXISTS tokens (
    id          BIGSERIAL PRIMARY KEY,
    action      token_action NOT NULL,
    secret      BYTEA DEFAULT gen_random_bytes(32) UNIQUE NOT NULL,
    code        VARCHAR(5) DEFAULT LPAD(TO_CHAR(RANDOM() * 100000, 'FM00000'), 5, '0'),
    account     BIGINT NOT NULL,
    expires_at  INTEGER DEFAULT EXTRACT(EPOCH FROM NOW() + INTERVAL '15 minute') NOT NULL,
    consumed_at INTEGER,
    created_at  INTEGER DEFAULT EXTRACT(EPOCH FROM NOW()) NOT NULL,

    FOREIGN KEY (account) REFERENCES accounts (id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED
);

CREATE INDEX IF NOT EXISTS accounts_id_status_idx ON accounts (id, status);

CREATE INDEX IF NOT EXISTS tokens_id_expires_consumed_action_idx ON tokens
    (id, expires_at, consumed_at, action);

-- An activation token is created in the same transaction as its account.
CREATE OR REPLACE FUNCTION trg_before_account_insert()
    RETURNS TRIGGER
    LANGUAGE plpgsql
AS $$
BEGIN
    IF (NEW.status = 'provisioned') THEN
        INSERT INTO tokens (account, action) VALUES (NEW.id, 'activation');
    END IF;
    RETURN NEW;
END;
$$;

DROP TRIGGER IF EXISTS before_account_insert ON accounts;
CREATE TRIGGER before_account_insert
    BEFORE INSERT ON accounts
    FOR EACH ROW
    EXECUTE FUNCTION trg_before_account_insert();

-- Status timestamps; unsuspending an account that was never activated
-- returns it to 'provisioned'.
CREATE OR REPLACE FUNCTION trg_before_account_status_change()
    RETURNS TRIGGER
    LANGUAGE plpgsql
AS $$
DECLARE
    ts integer := extract(epoch FROM now());
BEGIN
    IF (NEW.status = OLD.status) THEN
        RETURN NEW;
    END IF;

    NEW.status_changed_at = ts;

    IF (NEW.status = 'active') THEN
        IF (OLD.status = 'provisioned') THEN
            NEW.activated_at = ts;
        ELSIF (OLD.status = 'suspended') THEN
            NEW.unsuspended_at = ts;
            NEW.suspended_at = NULL;
            IF (OLD.activated_at IS NULL) THEN
                NEW.status = 'provisioned';
            END IF;
        END IF;
    ELSIF (NEW.status = 'suspended') THEN
        NEW.suspended_at = ts;
        NEW.unsuspended_at = NULL;
    END IF;
    RETURN NEW;
END;
$$;

DROP TRIGGER IF EXISTS before_account_status_change ON accounts;
CREATE TRIGGER before_account_status_change
    BEFORE UPDATE OF status ON accounts
    FOR EACH ROW
    EXECUTE FUNCTION trg_before_account_status_change();

-- Consuming an activation token activates its account.
CREATE OR REPLACE FUNCTION trg_after_token_consumed()
    RETURNS TRIGGER
    LANGUAGE plpgsql
AS $$
BEGIN
    IF (NEW.action != 'activation') THEN
        RETURN NULL;
    END IF;
    UPDATE accounts SET status = 'active'
    WHERE id = NEW.account AND status = 'provisioned';
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS after_token_consumed ON tokens;
CREATE TRIGGER after_token_consumed
    AFTER UPDATE OF consumed_at ON tokens
    FOR EACH ROW
    WHEN (NEW.consumed_at IS NOT NULL AND OLD.consumed_at IS NULL)
    EXECUTE FUNCTION trg_after_token_consumed();

-- The search_path tailer migrate set: this schema alone.
SELECT set_config('search_path', format('%I, pg_temp', current_schema()), false);
