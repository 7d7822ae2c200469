-- The CLI's stored conversations on this executor (executor/sessions/), and the threads made from them.

-- name: upsert_claude_session --
INSERT INTO claude_sessions (executor, session_id, config_dir, path, cwd, title, git_branch, last_activity,
                             message_count, size_bytes, live_pid, readable, unreadable_reason, adoptable, indexed_at)
VALUES (%(executor)s, %(session_id)s, %(config_dir)s, %(path)s, %(cwd)s, %(title)s, %(git_branch)s,
        %(last_activity)s, %(message_count)s, %(size_bytes)s, %(live_pid)s, %(readable)s, %(unreadable_reason)s,
        %(adoptable)s, now())
ON CONFLICT (executor, session_id) DO UPDATE
SET config_dir = EXCLUDED.config_dir, path = EXCLUDED.path, cwd = EXCLUDED.cwd, title = EXCLUDED.title,
    git_branch = EXCLUDED.git_branch, last_activity = EXCLUDED.last_activity,
    message_count = EXCLUDED.message_count, size_bytes = EXCLUDED.size_bytes, live_pid = EXCLUDED.live_pid,
    readable = EXCLUDED.readable, unreadable_reason = EXCLUDED.unreadable_reason, adoptable = EXCLUDED.adoptable,
    indexed_at = now()

-- name: delete_claude_session --
DELETE FROM claude_sessions WHERE executor = %(executor)s AND session_id = %(session_id)s

-- name: delete_claude_sessions_except --
-- At an executor's start: what an earlier run published of files that are gone meanwhile.
DELETE FROM claude_sessions WHERE executor = %(executor)s AND NOT (session_id = ANY(%(keep)s::text[]))

-- name: get_adopted_session --
-- The conversation a thread was made from (null: a thread of its own).
SELECT adopted_session_id FROM sessions WHERE id = %(id)s

-- name: check_conversation_taken --
-- A conversation already continued by a thread that is not archived (its own, or one adopted without a fork):
-- a second thread writing into it would interleave two histories.
SELECT id FROM sessions
WHERE role = 'orchestrator' AND lifecycle <> 'archived'
  AND (cli_session_id = %(session_id)s OR id = %(session_id)s::uuid)
LIMIT 1

-- name: insert_adopted_thread --
INSERT INTO sessions (id, role, lifecycle, title, mode, executor_name, adopted_session_id, cli_session_id,
                      cli_config_dir, cli_workdir, cli_fork_from, cli_import_offset, resume_command)
VALUES (%(id)s, 'orchestrator', 'idle', %(title)s, %(mode)s, %(executor)s, %(adopted_session_id)s,
        %(cli_session_id)s, %(cli_config_dir)s, %(cli_workdir)s, %(cli_fork_from)s, %(cli_import_offset)s,
        %(resume_command)s)
ON CONFLICT (id) DO NOTHING
RETURNING id

-- name: list_threads_of_conversations --
-- This executor's threads speaking in these conversations (whose files grew): a terminal may have added to
-- them. turn_open: the thread's own turn may be what is writing (its lines are imported once it ended).
SELECT s.id, s.cli_session_id, s.cli_config_dir, s.cli_import_offset,
       EXISTS (SELECT 1 FROM tasks t WHERE t.session_id = s.id
               AND (t.status IN ('pending', 'running') OR t.settled_at IS NULL)) AS turn_open
FROM sessions s
WHERE s.role = 'orchestrator' AND s.cli_session_id = ANY(%(ids)s::text[])
  AND coalesce(s.executor_name, %(executor)s) = %(executor)s AND s.lifecycle <> 'archived'

-- name: list_thread_turn_windows --
-- When each of a thread's turns ran: what the conversation's file gained then is the thread's own, already
-- in the journal as the turn's lines.
SELECT started_at, ended_at FROM tasks
WHERE session_id = %(id)s AND started_at IS NOT NULL ORDER BY started_at

-- name: advance_thread_import --
-- Compare-and-set: two passes (or executors) never import one stretch of the file twice.
UPDATE sessions SET cli_import_offset = %(offset)s
WHERE id = %(id)s AND cli_import_offset IS NOT DISTINCT FROM %(previous)s
RETURNING id
