DROP TABLE IF EXISTS mailroom_inbox;
