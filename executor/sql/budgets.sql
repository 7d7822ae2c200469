-- A routine run's budget asks (executor/settle/budget_store.py, executor/settle/budgets.py; migration 0045).

-- name: get_budget_run --
-- A routine run at its cap, for its budget ask: the routine's name, its USD per run, what the user raised it by,
-- and what the run's processes cost so far (every result line of its tasks).
WITH RECURSIVE run_tasks AS (
    SELECT t.id FROM routine_runs r JOIN tasks t ON t.session_id = r.thread_id WHERE r.id = %(run_id)s
    UNION
    SELECT c.id FROM run_tasks x JOIN tasks c ON c.parent_task_id = x.id
)
SELECT rt.name, rt.usd_per_run::float8 AS usd_per_run, r.usd_raised::float8 AS usd_raised, r.thread_id,
       (SELECT coalesce(sum(stream_cost_usd(j.payload)), 0)::float8 FROM journal j
        WHERE j.event_type = 'stream.result' AND j.task_id IN (SELECT id FROM run_tasks)) AS spent
FROM routine_runs r JOIN routines rt ON rt.id = r.routine_id
WHERE r.id = %(run_id)s

-- name: insert_budget_escalation --
INSERT INTO escalations (task_id, thread_id, question_id, kind, run_id, raise_usd, deadline)
VALUES (%(task_id)s, %(thread_id)s, %(question_id)s, 'budget', %(run_id)s, %(raise_usd)s,
        CASE WHEN %(wait_s)s::float8 IS NULL THEN NULL ELSE now() + make_interval(secs => %(wait_s)s::float8) END)

-- name: update_run_usd_raised --
-- The user raised a run's cap: what its next processes may spend grows by this much (grant_run_budget).
UPDATE routine_runs SET usd_raised = usd_raised + %(usd)s WHERE id = %(run_id)s
RETURNING usd_raised::float8 AS usd_raised

-- name: resolve_budget_escalation --
-- A budget ask answered; `reason`: why its run ends (NULL when raised: the run goes on). The routines' end pass
-- is woken: a run with nothing open any more ends now.
WITH resolved AS (
    UPDATE escalations SET status = 'resolved', decision = %(decision)s, reason = %(reason)s, resolved_at = now()
    WHERE id = %(id)s AND status = 'open' RETURNING task_id
)
SELECT pg_notify('task_ended', task_id::text) FROM resolved

-- name: close_expired_budget_questions --
-- An unattended run's budget ask past its deadline: its question closes unanswered (the settler then ends the
-- run, as when nobody could be asked).
UPDATE questions q SET status = 'cancelled', response = %(response)s
FROM escalations e
WHERE e.question_id = q.id AND e.status = 'open' AND e.deadline IS NOT NULL AND e.deadline <= now()
  AND q.status = 'pending'
RETURNING q.id
