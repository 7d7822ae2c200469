-- Ids as the command line takes them: a whole id or a prefix of one as `status` prints them (8 characters).
-- `prefix` holds only hex digits and dashes (petal_dispatch/commands/ids.py checks it); two rows say ambiguous.

-- name: list_task_ids_like --
SELECT id FROM tasks WHERE id::text LIKE %(prefix)s || '%%' ORDER BY id LIMIT 2

-- name: list_thread_ids_like --
-- a thread is an orchestrator's conversation (sessions.role); a worker's session is no thread
SELECT id FROM sessions WHERE role = 'orchestrator' AND id::text LIKE %(prefix)s || '%%' ORDER BY id LIMIT 2

-- name: list_routine_ids_like --
SELECT id FROM routines WHERE id::text LIKE %(prefix)s || '%%' ORDER BY id LIMIT 2

-- name: list_project_ids_like --
SELECT id FROM projects WHERE id::text LIKE %(prefix)s || '%%' ORDER BY id LIMIT 2
