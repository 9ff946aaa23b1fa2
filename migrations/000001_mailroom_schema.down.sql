-- pgcrypto stays: other schemas in the database may use it.
DROP TRIGGER IF EXISTS after_token_consumed ON tokens;
DROP TRIGGER IF EXISTS before_account_status_change ON accounts;
DROP TRIGGER IF EXISTS before_account_insert ON accounts;
DROP FUNCTION IF EXISTS trg_after_token_consumed();
DROP FUNCTION IF EXISTS trg_before_account_status_change();
DROP FUNCTION IF EXISTS trg_before_account_insert();
DROP TABLE IF EXISTS tokens;
DROP TABLE IF EXISTS accounts;
DROP TYPE IF EXISTS token_action;
DROP TYPE IF EXISTS account_status;
