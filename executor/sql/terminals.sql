-- Terminal sessions (executor/terminals/, migration 0047): the user's interactive Claude Code held in a
-- pseudo-terminal, a task of role `terminal` in a thread of its own.

-- name: find_conversation_thread --
-- The live thread that already speaks in a conversation (a terminal resuming it goes on in that thread).
SELECT id FROM sessions
WHERE role = 'orchestrator' AND lifecycle <> 'archived' AND cli_session_id = %(cli_session_id)s
ORDER BY created_at DESC LIMIT 1

-- name: insert_terminal_thread --
-- A thread speaking in the terminal's conversation (its directory and config directory): once the terminal
-- ends, the page's messages continue it with --resume. The import offset is the file's length at start: what
-- the terminal then writes is journaled by the session itself.
INSERT INTO sessions (id, role, lifecycle, title, mode, executor_name, adopted_session_id, cli_session_id,
                      cli_config_dir, cli_workdir, cli_import_offset, resume_command)
VALUES (%(id)s, 'orchestrator', 'idle', %(title)s, 'interactive', %(executor)s, %(cli_session_id)s,
        %(cli_session_id)s, %(config_dir)s, %(cwd)s, %(offset)s, %(resume_command)s)
ON CONFLICT (id) DO NOTHING
RETURNING id

-- name: insert_terminal_task --
-- Its run: running from the start (no supervisor claims it; its end is derived from its process's exit).
INSERT INTO tasks (id, session_id, role, brief, status, started_at, executor_name, workdir, pid)
VALUES (%(id)s, %(thread_id)s, 'terminal', %(brief)s, 'running', now(), %(executor)s, %(cwd)s, %(pid)s)

-- name: insert_terminal_session --
INSERT INTO terminal_sessions (task_id, thread_id, executor_name, cli_session_id, cwd, sandboxed, held_by)
VALUES (%(task_id)s, %(thread_id)s, %(executor)s, %(cli_session_id)s, %(cwd)s, %(sandboxed)s, %(held_by)s)

-- name: set_terminal_pid --
UPDATE tasks SET pid = %(pid)s WHERE id = %(id)s

-- name: set_terminal_holder --
UPDATE terminal_sessions SET held_by = %(held_by)s WHERE task_id = %(id)s AND ended_at IS NULL

-- name: set_terminal_input_waiting --
-- Whether a page's message waits on the terminal's input line; a row only when it changed (said once).
UPDATE terminal_sessions SET input_waiting = %(waiting)s
WHERE task_id = %(id)s AND ended_at IS NULL AND input_waiting <> %(waiting)s
RETURNING task_id

-- name: end_terminal_session --
-- The CLI exited: the session and its task end together (the task's status from the exit, as any run's);
-- the settler then wakes the thread, whose queued messages continue the conversation with --resume.
WITH ended AS (
    UPDATE terminal_sessions SET ended_at = now(), exit_code = %(exit_code)s, end_reason = %(reason)s,
                                 held_by = NULL, input_waiting = false
    WHERE task_id = %(id)s AND ended_at IS NULL
    RETURNING task_id
)
UPDATE tasks t SET status = %(status)s, status_reason = %(reason)s, exit_code = %(exit_code)s, activity = NULL,
                   ended_at = now()
FROM ended WHERE t.id = ended.task_id AND t.status = 'running'
RETURNING t.id

-- name: end_orphaned_terminal_sessions --
-- What an earlier run of this executor held: its processes went with it (their pseudo-terminals closed). Their
-- tasks were crashed by the start-up reconciliation; the sessions end here.
UPDATE terminal_sessions SET ended_at = now(), end_reason = 'executor_restart', held_by = NULL,
                             input_waiting = false
WHERE executor_name = %(executor)s AND ended_at IS NULL
RETURNING task_id, thread_id

-- name: take_terminal_chat --
-- The page's messages for a live terminal, oldest first (text only: a message with files waits for a turn
-- after the terminal ends).
UPDATE chat_queue c SET status = 'delivered', claimed_at = now(), done_at = now()
FROM (SELECT id FROM chat_queue
      WHERE thread_id = %(thread_id)s AND status = 'pending' AND origin = 'user'
        AND cardinality(attachment_ids) = 0
      ORDER BY created_at
      FOR UPDATE SKIP LOCKED LIMIT 1) picked
WHERE c.id = picked.id
RETURNING c.id, c.text

-- name: count_terminal_chat --
-- Whether the page's messages wait for this terminal.
SELECT count(*) AS waiting FROM chat_queue
WHERE thread_id = %(thread_id)s AND status = 'pending' AND origin = 'user' AND cardinality(attachment_ids) = 0

-- name: count_terminal_threads_in --
-- How many threads terminal sessions have begun or continued in this directory: a new one's title is numbered
-- after them, so two sessions of one project are told apart in the thread picker.
SELECT count(DISTINCT thread_id) AS threads FROM terminal_sessions WHERE cwd = %(cwd)s
