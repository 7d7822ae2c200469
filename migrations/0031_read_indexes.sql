-- Reads flat in the journal's size: what the page and the executor's loops read stays as fast on a year's
-- journal (millions of events) as on an empty one. Each index serves reads named below; the query-plan tests
-- (tests/store/test_query_plans.py) check that the plans use them.

-- One task's records of given types, newest or oldest first: its exit, its result line, its gate decisions,
-- its handoffs, a thread's conversation records of its workers, a run's usage. (task_id, seq) alone makes
-- these read every record of a long worker to find its one `task.exited`.
CREATE INDEX IF NOT EXISTS journal_task_type_seq_idx ON journal (task_id, event_type, seq);

-- How often a standing gate rule was used (the rules list counts them): only the decisions a rule made.
CREATE INDEX IF NOT EXISTS journal_rule_uses_idx ON journal ((payload ->> 'rule_id'))
    WHERE event_type = 'gate.decided' AND payload ->> 'decided_by' = 'rule';

-- The newest tasks (the task list) and the newest questions (the Asks panel's answered ones).
CREATE INDEX IF NOT EXISTS tasks_created_idx ON tasks (created_at);
CREATE INDEX IF NOT EXISTS questions_created_idx ON questions (created_at);

-- The thread list (newest first): threads only, not the session of every worker and extractor.
CREATE INDEX IF NOT EXISTS sessions_threads_idx ON sessions (created_at) WHERE role = 'orchestrator';

-- Each project's branches waiting for review (the project list counts them): the few, not all its tasks.
CREATE INDEX IF NOT EXISTS tasks_branches_waiting_idx ON tasks (project_id)
    WHERE branch IS NOT NULL AND review IS NULL AND changes_recorded_at IS NOT NULL;
