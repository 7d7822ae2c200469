-- A routine run found by its thread: a spawn's share of the run's USD (grant_run_budget), its dispatches'
-- lock (lock_routine_run_of_thread), and whether a turn's end is the run's to notify (check_thread_watched).
CREATE INDEX IF NOT EXISTS routine_runs_thread_idx ON routine_runs (thread_id);
