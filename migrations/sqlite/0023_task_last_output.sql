-- The last lines a task wrote before it ended, as its agent sent them with its stop report
-- (issue 41): why it ended stays known once its host and its log files are gone.
ALTER TABLE tasks ADD COLUMN last_output TEXT;
