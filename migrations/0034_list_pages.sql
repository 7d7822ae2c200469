-- The thread and task lists are read newest first, a page at a time (keyset on created_at, id): each page from
-- its index, however many threads and tasks a year leaves.
CREATE INDEX IF NOT EXISTS sessions_threads_created_idx ON sessions (created_at, id) WHERE role = 'orchestrator';
CREATE INDEX IF NOT EXISTS tasks_created_idx ON tasks (created_at, id);
