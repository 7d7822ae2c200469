-- Checks that feed back: a project may name a check command (e.g. `python -m pytest -q`). After each of its
-- workers ends, the executor runs it in the worker's sandbox on the worker's worktree, before the end is
-- settled; its result (passed, exit code, the last lines, duration) is a derived `task.check` record, shown on
-- the diff card and carried in the handoff. A failed check sends the work to a fix round (a follow-up worker on
-- the checked commit, the failure in its brief), at most check_retries times, then reports.
ALTER TABLE projects
    ADD COLUMN check_command text CHECK (length(check_command) BETWEEN 1 AND 2000),
    ADD COLUMN check_retries integer NOT NULL DEFAULT 1 CHECK (check_retries BETWEEN 0 AND 5);
-- which fix round a worker is (0: the first run; a round continues the one before it: continues_task_id)
ALTER TABLE tasks ADD COLUMN check_round integer NOT NULL DEFAULT 0 CHECK (check_round >= 0);

INSERT INTO event_types (name, tier, description) VALUES
    ('task.check', 'derived', 'a project''s check command, run by code in a worker''s sandbox on its worktree '
                              'after it ended: passed or failed, exit code, the last 200 lines, duration')
ON CONFLICT (name) DO NOTHING;
