-- Tasks and their runs: claims, processes, ends, sessions, credentials, lineage, warm turns (a task's creation,
-- request_task, is settle.sql's).

-- name: list_task_gate_denials --
-- How many of a task's calls its gate refused (the harness's own record: a tool error or a timeout is
-- missing from the CLI's permission_denials).
SELECT count(*) AS denied FROM journal
WHERE task_id = %(id)s AND event_type = 'gate.decided' AND payload ->> 'decision' = 'deny'

-- name: grant_harness_credential --
-- One credential per spawn; a task spawned again (never today) gets the new one.
INSERT INTO harness_credentials (token_sha256, task_id, session_id)
VALUES (%(token_sha256)s, %(task_id)s, %(session_id)s)
ON CONFLICT (task_id) DO UPDATE SET token_sha256 = EXCLUDED.token_sha256, session_id = EXCLUDED.session_id,
                                    created_at = now(), revoked_at = NULL

-- name: revoke_harness_credential --
UPDATE harness_credentials SET revoked_at = now() WHERE task_id = %(task_id)s AND revoked_at IS NULL

-- name: get_harness_caller --
-- Who holds a credential: its task, the spawn's session, and the thread (an orchestrator turn's own
-- session, or the session of the orchestrator turn that dispatched the task).
SELECT c.task_id, c.session_id, c.revoked_at, t.status, t.role,
       coalesce(t.project_id, s.project_id, ps.project_id) AS project_id,
       CASE WHEN s.role = 'orchestrator' THEN s.id ELSE ps.id END AS thread_id
FROM harness_credentials c
JOIN tasks t ON t.id = c.task_id
LEFT JOIN sessions s ON s.id = c.session_id
LEFT JOIN tasks p ON p.id = t.parent_task_id
LEFT JOIN sessions ps ON ps.id = p.session_id AND ps.role = 'orchestrator'
WHERE c.token_sha256 = %(token_sha256)s

-- name: get_dispatching_call --
-- The orchestrator's journaled tool call that asked for a worker: the `stream.assistant` line of the
-- dispatching task whose tool_use block carries the tool_use_id its dispatch recorded.
SELECT c.event_id
FROM journal r
JOIN journal c ON c.task_id = (r.payload->>'parent_task_id')::uuid AND c.event_type = 'stream.assistant'
WHERE r.task_id = %(id)s AND r.event_type = 'task.dispatch_requested' AND r.payload ? 'tool_use_id'
  AND c.payload->'message'->'content'
      @> jsonb_build_array(jsonb_build_object('type', 'tool_use', 'id', r.payload->>'tool_use_id'))
ORDER BY c.seq DESC
LIMIT 1

-- name: get_dispatch_tool_use --
-- The tool_use_id a task's dispatch recorded (null: not dispatched by a tool call).
SELECT payload->>'tool_use_id' AS tool_use_id
FROM journal
WHERE task_id = %(id)s AND event_type = 'task.dispatch_requested'
ORDER BY seq
LIMIT 1

-- name: get_task_exit_event --
SELECT event_id FROM journal WHERE task_id = %(id)s AND event_type = 'task.exited' ORDER BY seq DESC LIMIT 1

-- name: claim_pending_tasks --
-- Chat turns first (a thread turn a user's message started), then the rest of the user's work (workers, turns on
-- harness reports), then unattended work (a routine run's turns, retries), each oldest first: at most %(n)s in
-- all, and unattended work only within %(n_unattended)s (the supervisor keeps the last free slot for chat). SKIP
-- LOCKED so a concurrent claimer never blocks or takes the same row. A back-off retry waits for its not_before
-- (the poll picks it up then). Only what may run here (placement: a named executor, required labels, the
-- project's executor, the executor of the session's first turn unless the CLI config directory is shared), and
-- only while this run's lease is live: a fenced run claims nothing.
WITH claimable AS (
    SELECT c.id, c.chat, c.created_at,
           (c.attempt > 1 OR EXISTS (SELECT 1 FROM routine_runs r WHERE r.thread_id = c.session_id)) AS unattended
    FROM tasks c
    LEFT JOIN projects p ON p.id = c.project_id
    LEFT JOIN sessions s ON s.id = c.session_id
    WHERE c.status = 'pending' AND (c.not_before IS NULL OR c.not_before <= now())
      AND (c.placement_executor IS NULL OR c.placement_executor = %(name)s)
      AND c.required_labels <@ %(labels)s::text[]
      AND (p.executor_name IS NULL OR p.executor_name = %(name)s)
      AND (%(shared_config)s OR s.executor_name IS NULL OR s.executor_name = %(name)s)
      AND EXISTS (SELECT 1 FROM executors e WHERE e.name = %(name)s AND e.epoch = %(epoch)s
                  AND e.lost_at IS NULL AND e.lease_until > now())
      -- a worker of an interactive thread waits for the user's approval (migration 0021)
      AND NOT EXISTS (SELECT 1 FROM approvals a WHERE a.task_id = c.id AND a.status = 'open')
), chat AS (
    SELECT t.id FROM tasks t JOIN claimable USING (id) WHERE claimable.chat
    ORDER BY claimable.created_at FOR UPDATE OF t SKIP LOCKED LIMIT %(n)s
), attended AS (
    SELECT t.id FROM tasks t JOIN claimable USING (id) WHERE NOT claimable.chat AND NOT claimable.unattended
    ORDER BY claimable.created_at FOR UPDATE OF t SKIP LOCKED
    LIMIT greatest(0, %(n)s - (SELECT count(*) FROM chat))
), unattended AS (
    SELECT t.id FROM tasks t JOIN claimable USING (id) WHERE NOT claimable.chat AND claimable.unattended
    ORDER BY claimable.created_at FOR UPDATE OF t SKIP LOCKED
    LIMIT greatest(0, least(%(n_unattended)s, %(n)s - (SELECT count(*) FROM chat)) - (SELECT count(*) FROM attended))
)
UPDATE tasks t
SET status = 'running', activity = 'running', started_at = now(), last_output_at = now(),
    executor_name = %(name)s, executor_epoch = %(epoch)s
FROM (SELECT id FROM chat UNION ALL SELECT id FROM attended UNION ALL SELECT id FROM unattended) picked
WHERE t.id = picked.id
RETURNING t.id, t.project_id, t.session_id, t.parent_task_id, t.role, t.brief, t.plan_ref, t.workdir,
          t.allowed_tools, t.attempt, t.json_schema, t.attachment_ids, t.max_budget_usd::float8 AS max_budget_usd,
          t.chat

-- name: mark_waiting_for_slot --
-- Every slot is busy (or the free one is kept for chat, %(chat_too)s false: then only unattended work, a routine
-- run's turns and retries, waits): the tasks that could be claimed here
-- now wait, visibly (a pending task's activity; the claim sets `running`). Rows that say so already are left alone
-- (an activity write notifies the page). Returns those marked.
UPDATE tasks c SET activity = 'waiting_for_slot'
FROM tasks t
LEFT JOIN projects p ON p.id = t.project_id
LEFT JOIN sessions s ON s.id = t.session_id
WHERE c.id = t.id AND t.status = 'pending' AND t.activity IS NULL AND (t.not_before IS NULL OR t.not_before <= now())
  AND (%(chat_too)s OR (NOT t.chat AND (t.attempt > 1 OR EXISTS (SELECT 1 FROM routine_runs r
                                                                   WHERE r.thread_id = t.session_id))))
  AND (t.placement_executor IS NULL OR t.placement_executor = %(name)s)
  AND t.required_labels <@ %(labels)s::text[]
  AND (p.executor_name IS NULL OR p.executor_name = %(name)s)
  AND (%(shared_config)s OR s.executor_name IS NULL OR s.executor_name = %(name)s)
  AND NOT EXISTS (SELECT 1 FROM approvals a WHERE a.task_id = t.id AND a.status = 'open')
RETURNING c.id

-- name: list_parked_tasks --
-- Which of these running tasks are parked on the user (a pending question of theirs that their tool call still
-- waits on), oldest question first; late_ok: its question can outlive the process (its answer then goes to a
-- thread as a message: the asking turn's thread, or the thread whose turn dispatched the asking worker); resumes:
-- the answer then resumes the asking conversation itself (a thread's turn asked it with ask_user_question, so the
-- late-answer note carries it into that conversation's next turn).
SELECT * FROM (
    SELECT DISTINCT ON (q.task_id) q.task_id, q.id AS question_id, q.created_at AS asked_at,
           (q.asked_by = 'model' AND EXISTS (SELECT 1 FROM tasks t JOIN sessions s ON s.id = t.session_id
                                             AND s.role = 'orchestrator' WHERE t.id = q.task_id)) AS resumes,
           (EXISTS (SELECT 1 FROM tasks t JOIN sessions s ON s.id = t.session_id AND s.role = 'orchestrator'
                    WHERE t.id = q.task_id)
            OR EXISTS (SELECT 1 FROM tasks t JOIN tasks p ON p.id = t.parent_task_id
                       JOIN sessions s ON s.id = p.session_id AND s.role = 'orchestrator'
                       WHERE t.id = q.task_id)) AS late_ok
    FROM questions q
    WHERE q.status = 'pending' AND q.timed_out_at IS NULL AND q.task_id = ANY(%(ids)s::uuid[])
    ORDER BY q.task_id, q.created_at
) parked
ORDER BY asked_at

-- name: release_parked_questions --
-- A parked process ended past the bound: its pending questions stay answerable, marked late (as a timed-out
-- ask_user_question's are): an answer goes to the thread as a message and resumes the conversation in a new turn
-- (executor/settle/approvals.py deliver_late_answers), and its process's end does not close them.
UPDATE questions SET timed_out_at = now()
WHERE task_id = %(task_id)s AND status = 'pending' AND timed_out_at IS NULL
RETURNING id

-- name: get_role_profile --
SELECT role, system_prompt, allowed_tools, use_mcp FROM role_profiles WHERE role = %(role)s

-- name: insert_session --
INSERT INTO sessions (id, project_id, role, lifecycle, substrate_session_id)
VALUES (%(id)s, %(project_id)s, %(role)s, %(lifecycle)s, %(id)s::text)
ON CONFLICT (id) DO UPDATE SET lifecycle = EXCLUDED.lifecycle, updated_at = now()

-- name: upsert_running_session --
-- The session a run speaks in: running, one more turn, and pinned to its first turn's executor (its CLI
-- config directory holds what `--resume` reads). One statement: it is on the way to every spawn.
INSERT INTO sessions (id, project_id, role, lifecycle, substrate_session_id, turns, executor_name)
VALUES (%(id)s, %(project_id)s, %(role)s, 'running', %(id)s::text, 1, %(name)s)
ON CONFLICT (id) DO UPDATE SET lifecycle = 'running', turns = sessions.turns + 1, updated_at = now(),
                               executor_name = coalesce(sessions.executor_name, EXCLUDED.executor_name)

-- name: update_session --
UPDATE sessions
SET lifecycle = %(lifecycle)s,
    substrate_session_id = coalesce(%(substrate_session_id)s, substrate_session_id),
    updated_at = now()
WHERE id = %(id)s

-- name: get_session_cli --
-- What a turn's spawn needs of the conversation it continues (an adopted thread's own directory and file).
SELECT adopted_session_id, cli_session_id, cli_config_dir, cli_workdir, cli_fork_from, resume_command
FROM sessions WHERE id = %(id)s

-- name: mark_session_cli --
-- After a turn's spawn: the conversation it speaks in and where, for the command that continues it in a
-- terminal (written only when it changed).
UPDATE sessions SET cli_session_id = %(cli_session_id)s, cli_workdir = %(cli_workdir)s,
                    resume_command = %(resume_command)s
WHERE id = %(id)s AND role = 'orchestrator'
  AND (cli_session_id IS DISTINCT FROM %(cli_session_id)s OR cli_workdir IS DISTINCT FROM %(cli_workdir)s
       OR resume_command IS DISTINCT FROM %(resume_command)s)

-- name: set_task_process --
UPDATE tasks SET pid = %(pid)s, session_id = %(session_id)s WHERE id = %(id)s

-- name: finish_task --
-- Fenced: only the run that claimed the task, while no survivor has taken it over, writes its end.
UPDATE tasks
SET status = %(status)s, status_reason = %(reason)s, exit_code = %(exit_code)s, exit_signal = %(exit_signal)s,
    activity = NULL, ended_at = now(), last_output_at = coalesce(%(last_output_at)s, last_output_at)
WHERE id = %(id)s AND status = 'running' AND executor_name = %(name)s AND executor_epoch = %(epoch)s
  AND EXISTS (SELECT 1 FROM executors e WHERE e.name = %(name)s AND e.epoch = %(epoch)s AND e.lost_at IS NULL)
RETURNING id

-- name: set_task_activity --
UPDATE tasks SET activity = %(activity)s WHERE id = %(id)s AND status = 'running'

-- name: touch_tasks_output --
UPDATE tasks t SET last_output_at = u.at
FROM unnest(%(ids)s::uuid[], %(ats)s::timestamptz[]) AS u(id, at)
WHERE t.id = u.id

-- name: mark_stop_requested --
UPDATE tasks SET stop_requested_at = now() WHERE id = %(id)s

-- name: cancel_pending_task --
UPDATE tasks SET status = 'cancelled', status_reason = %(reason)s, ended_at = now(), activity = NULL
WHERE id = %(id)s AND status = 'pending'
RETURNING id

-- name: claim_stop_requests --
-- A stop for a task running on another executor is that executor's to handle.
UPDATE stop_queue q
SET status = 'claimed', claimed_at = now()
FROM (
    SELECT s.id FROM stop_queue s WHERE s.status = 'pending'
      AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = s.task_id AND t.status = 'running'
                      AND t.executor_name IS DISTINCT FROM %(name)s)
    ORDER BY s.created_at FOR UPDATE OF s SKIP LOCKED LIMIT 100
) picked
WHERE q.id = picked.id
RETURNING q.id, q.task_id, q.reason

-- name: finish_stop_request --
UPDATE stop_queue SET status = %(status)s, error = %(error)s, done_at = now() WHERE id = %(id)s

-- name: list_tasks_with_pending_questions --
-- a question that timed out no longer holds its asker (the tool returned): it may stall again
SELECT DISTINCT task_id FROM questions WHERE status = 'pending' AND timed_out_at IS NULL
                                          AND task_id = ANY(%(ids)s::uuid[])

-- name: list_orphaned_running_tasks --
-- This executor's own (an earlier run of its name; unnamed rows predate the fleet): others' are theirs.
SELECT id, pid, project_id, session_id, parent_task_id, role, brief, plan_ref, workdir, allowed_tools, attempt,
       json_schema, attachment_ids, max_budget_usd::float8 AS max_budget_usd, chat
FROM tasks WHERE status = 'running' AND (executor_name = %(name)s OR executor_name IS NULL)

-- name: crash_task --
UPDATE tasks SET status = 'crashed', status_reason = %(reason)s, activity = NULL, ended_at = now()
WHERE id = %(id)s AND status = 'running'

-- name: requeue_claimed --
-- Rows claimed by a dead run go back to pending. With other live executors a claimed row may be theirs
-- (in hand right now): only rows claimed longer than a lease ago are taken back then.
WITH alone AS (
    SELECT NOT EXISTS (SELECT 1 FROM executors e WHERE e.name <> %(name)s AND e.lost_at IS NULL
                       AND e.stopped_at IS NULL AND e.lease_until > now()) AS yes
), chat AS (
    UPDATE chat_queue SET status = 'pending', claimed_at = NULL
    WHERE status = 'claimed' AND ((SELECT yes FROM alone) OR claimed_at < now() - make_interval(secs => %(stale_s)s))
    RETURNING 1
), stops AS (
    UPDATE stop_queue SET status = 'pending', claimed_at = NULL
    WHERE status = 'claimed' AND ((SELECT yes FROM alone) OR claimed_at < now() - make_interval(secs => %(stale_s)s))
    RETURNING 1
), threads AS (
    UPDATE thread_control_queue SET status = 'pending', claimed_at = NULL
    WHERE status = 'claimed' AND ((SELECT yes FROM alone) OR claimed_at < now() - make_interval(secs => %(stale_s)s))
    RETURNING 1
)
SELECT (SELECT count(*) FROM chat) AS chat, (SELECT count(*) FROM stops) AS stop,
       (SELECT count(*) FROM threads) AS thread_control

-- name: cancel_orphaned_questions --
-- A question whose asking process is gone can never be delivered: close it visibly.
UPDATE questions q SET status = 'cancelled', response = 'the asking process ended (executor restart)'
WHERE q.status = 'pending'
  AND (q.task_id IS NULL OR NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = q.task_id AND t.status = 'running'))
  -- an escalation waits on nobody's process: it stays open across restarts
  AND NOT EXISTS (SELECT 1 FROM escalations e WHERE e.question_id = q.id)
  -- nor does an approval, nor a question that timed out (its late answer goes to the thread)
  AND NOT EXISTS (SELECT 1 FROM approvals a WHERE a.question_id = q.id) AND q.timed_out_at IS NULL
RETURNING q.id, q.task_id

-- name: insert_imported_task --
-- An imported transcript's end happened elsewhere: nothing is owed on it (settled on insert).
INSERT INTO tasks (id, project_id, session_id, role, brief, status, status_reason, started_at, ended_at, settled_at)
VALUES (%(id)s, %(project_id)s, %(session_id)s, %(role)s, %(brief)s, %(status)s, %(reason)s, now(), now(), now())

-- name: get_project_sandbox_allow --
-- The hosts a project's workers may reach through their sandbox's proxy, besides the operator's.
SELECT sandbox_allow FROM projects WHERE id = %(project_id)s

-- name: get_task_check --
-- A project worker's check (migration 0043): its project's command, for a worker that ran in a worktree of its own.
SELECT p.check_command FROM tasks t JOIN projects p ON p.id = t.project_id
WHERE t.id = %(id)s AND t.worktree IS NOT NULL AND p.check_command IS NOT NULL

-- name: list_task_attachments --
-- The files a task is fed with its brief, in the order the user sent them; an image with its copy for the
-- model, when it has one.
SELECT id, name, media_type, data, model_data, model_media_type FROM attachments
WHERE id = ANY(%(ids)s::uuid[])
ORDER BY array_position(%(ids)s::uuid[], id)

-- name: list_task_attachment_files --
-- The files a task carries (a turn: the ones its messages were sent with), in order, without their bytes:
-- what a worker it dispatches may be handed.
SELECT a.id, a.name, a.media_type, a.size_bytes
FROM tasks t CROSS JOIN LATERAL unnest(t.attachment_ids) WITH ORDINALITY AS u(id, n)
JOIN attachments a ON a.id = u.id
WHERE t.id = %(task_id)s
ORDER BY u.n

-- name: grant_run_budget --
-- What a routine run's task may spend, taken at its spawn: the run's USD per run (with what the user raised it by)
-- less what its ended processes
-- cost (their result lines), and never more than the task was given. Under the run's row lock, so spawns of one
-- run read each other's ends in order. The grant is written back: the task shows what its process was allowed.
WITH RECURSIVE up AS (
    SELECT t.id, t.parent_task_id, t.session_id, 0 AS depth FROM tasks t WHERE t.id = %(task_id)s
    UNION ALL
    SELECT p.id, p.parent_task_id, p.session_id, up.depth + 1 FROM up JOIN tasks p ON p.id = up.parent_task_id
    WHERE up.depth < 64
), run AS (
    SELECT r.id, r.thread_id, (rt.usd_per_run + r.usd_raised)::float8 AS cap  -- raised by the user's answers
    FROM routine_runs r JOIN routines rt ON rt.id = r.routine_id
    WHERE r.thread_id IN (SELECT session_id FROM up WHERE session_id IS NOT NULL) AND rt.usd_per_run IS NOT NULL
    ORDER BY r.started_at DESC LIMIT 1
    FOR UPDATE OF r
), run_tasks AS (
    SELECT t.id FROM tasks t JOIN run ON t.session_id = run.thread_id
    UNION
    SELECT c.id FROM run_tasks x JOIN tasks c ON c.parent_task_id = x.id
), spent AS (
    SELECT coalesce(sum(stream_cost_usd(j.payload)), 0)::float8 AS usd FROM journal j
    WHERE j.event_type = 'stream.result' AND j.task_id IN (SELECT id FROM run_tasks)
), granted AS (
    SELECT least(t.max_budget_usd::float8, greatest(run.cap - spent.usd, 0)) AS usd, run.cap, spent.usd AS spent
    FROM tasks t, run, spent WHERE t.id = %(task_id)s
), written AS (  -- nothing left is not written (the column holds a positive cap): the task is not started
    UPDATE tasks t SET max_budget_usd = g.usd FROM granted g WHERE t.id = %(task_id)s AND g.usd > 0
)
SELECT usd AS granted, cap, spent FROM granted

-- name: list_warm_candidates --
-- Warm turns (executor/run/spawn/warm_pool.py): which threads' next turns to start ahead of their messages.
-- Threads likely to get the next message: those a page showed lately (client_presence) and those whose turn
-- just ended here (offered), each with its latest turn, which the next one's spawn is made of. Not a thread
-- archived, with a turn pending or running (its conversation is not stored yet), or pinned to another
-- executor (its conversation is there). Driven from the few ids, each looked up by key.
WITH shown AS (
    SELECT thread_id, max(seen_at) AS seen_at FROM client_presence
    WHERE thread_id IS NOT NULL AND seen_at > now() - make_interval(secs => %(presence_s)s)
    GROUP BY thread_id
), wanted AS (
    SELECT id FROM unnest(%(offered)s::uuid[]) AS o(id) UNION SELECT thread_id FROM shown
)
SELECT s.id AS session_id, t.project_id, t.role, t.workdir, t.allowed_tools, shown.seen_at
FROM wanted w
JOIN sessions s ON s.id = w.id
LEFT JOIN shown ON shown.thread_id = s.id
JOIN LATERAL (SELECT project_id, role, workdir, allowed_tools, status, json_schema FROM tasks
              WHERE session_id = s.id ORDER BY created_at DESC LIMIT 1) t ON true
WHERE s.role = 'orchestrator' AND s.lifecycle <> 'archived'
  AND (s.executor_name IS NULL OR s.executor_name = %(name)s)
  AND t.role = 'orchestrator' AND t.json_schema IS NULL AND t.status NOT IN ('pending', 'running')
  AND NOT EXISTS (SELECT 1 FROM tasks o WHERE o.session_id = s.id AND o.status IN ('pending', 'running'))
ORDER BY shown.seen_at DESC NULLS LAST
LIMIT %(n)s
