-- Projects, worktrees and workers' recorded changes.

-- name: claim_project_requests --
UPDATE project_queue q SET status = 'claimed', claimed_at = now()
FROM (SELECT id FROM project_queue WHERE status = 'pending' ORDER BY created_at
      FOR UPDATE SKIP LOCKED LIMIT 20) picked
WHERE q.id = picked.id
RETURNING q.id, q.action, q.task_id, q.args, q.created_at

-- name: requeue_claimed_project_requests --
-- The executor is a singleton: a row claimed by a previous one that died goes back to pending.
UPDATE project_queue SET status = 'pending', claimed_at = NULL WHERE status = 'claimed'

-- name: finish_project_request --
UPDATE project_queue SET status = %(status)s, error = %(error)s, result = %(result)s, done_at = now()
WHERE id = %(id)s

-- name: insert_project --
INSERT INTO projects (name, workdir, plan, plan_path, sandbox_allow, check_command, check_retries, push_remote)
VALUES (%(name)s, %(workdir)s, %(plan)s, %(plan_path)s, %(sandbox_allow)s, %(check_command)s, %(check_retries)s,
        %(push_remote)s)
ON CONFLICT (name) DO NOTHING
RETURNING id

-- name: get_project_remote --
SELECT id, workdir, push_remote FROM projects WHERE id = %(id)s

-- name: set_project_push_remote --
UPDATE projects SET push_remote = %(push_remote)s WHERE id = %(id)s

-- name: get_project_by_workdir --
SELECT id FROM projects WHERE workdir = %(workdir)s

-- name: get_worktree_source --
-- Whether a claimed task runs in a worktree of its own: a task of a project whose role asks for one. A follow-up
-- of a reviewed worker (continues_task_id) starts at the commit the review was of (its last task.changes) and
-- merges into the branch that worker's did.
SELECT p.id AS project_id, p.name, p.workdir, c.base_branch AS start_base_branch,
       (SELECT j.payload ->> 'head_commit' FROM journal j
        WHERE j.task_id = t.continues_task_id AND j.event_type = 'task.changes' ORDER BY j.seq DESC LIMIT 1)
           AS start_commit,
       t.continues_task_id
FROM tasks t
JOIN projects p ON p.id = t.project_id
JOIN role_profiles r ON r.role = t.role AND r.isolated_worktree
LEFT JOIN tasks c ON c.id = t.continues_task_id
WHERE t.id = %(id)s AND p.workdir IS NOT NULL

-- name: set_task_worktree --
UPDATE tasks SET workdir = %(worktree)s, worktree = %(worktree)s, branch = %(branch)s,
    base_branch = %(base_branch)s, base_commit = %(base_commit)s
WHERE id = %(id)s

-- name: get_task_worktree --
SELECT t.id, t.project_id, t.session_id, t.status, t.worktree, t.branch, t.base_branch, t.base_commit,
       t.changes_recorded_at, t.review, p.workdir AS project_workdir
FROM tasks t JOIN projects p ON p.id = t.project_id
WHERE t.id = %(id)s

-- name: set_task_review --
UPDATE tasks SET review = %(review)s WHERE id = %(id)s AND review IS NULL
RETURNING id

-- name: get_project_plan --
SELECT name, plan FROM projects WHERE id = %(id)s

-- name: get_latest_task_changes --
SELECT payload FROM journal WHERE task_id = %(id)s AND event_type = 'task.changes' ORDER BY seq DESC LIMIT 1
