DROP TABLE IF EXISTS tailer_resync;
