-- name: list_handoffs --
-- Newest first, for whatever scope the id names: a task, a session (and the workers it dispatched) or a project.
-- Each part read newest first from its own index and cut at `limit` (one scan over the OR of them walks every
-- handoff ever made).
SELECT event_id, seq, project_id, session_id, task_id, parent_id, message_id, event_type, tier, created_at, payload
FROM journal
WHERE event_type = 'handoff' AND event_id IN (
    (SELECT event_id FROM journal WHERE task_id = %(scope)s AND event_type = 'handoff'
     ORDER BY task_id, event_type, seq DESC LIMIT %(limit)s)
    UNION ALL
    (SELECT event_id FROM journal WHERE session_id = %(scope)s AND event_type = 'handoff'
     ORDER BY session_id, seq DESC LIMIT %(limit)s)
    UNION ALL
    (SELECT event_id FROM journal WHERE project_id = %(scope)s AND event_type = 'handoff'
     ORDER BY project_id, seq DESC LIMIT %(limit)s)
    UNION ALL
    (SELECT h.event_id FROM tasks t JOIN tasks p ON p.id = t.parent_task_id
     CROSS JOIN LATERAL (SELECT event_id FROM journal WHERE task_id = t.id AND event_type = 'handoff'
                         ORDER BY seq DESC LIMIT %(limit)s) h
     WHERE p.session_id = %(scope)s))
ORDER BY seq DESC
LIMIT %(limit)s

-- name: get_project --
SELECT id, name, workdir, plan, created_at FROM projects WHERE id = %(id)s

-- name: list_project_latest_tasks --
-- The latest task of each plan task id, and what became of it.
SELECT DISTINCT ON (coalesce(plan_ref, id::text)) coalesce(plan_ref, '') AS plan_ref, id, status, activity,
       status_reason, ended_at
FROM tasks
WHERE project_id = %(id)s AND role = 'worker'
ORDER BY coalesce(plan_ref, id::text), created_at DESC

-- name: list_matching_rule_outs --
-- Prior rule-outs in the scope whose approach's words (English stems) mostly appear in the candidate.
WITH candidate AS (SELECT tsvector_to_array(to_tsvector('english', %(candidate)s)) AS words),
rule_outs AS (
    SELECT j.seq, j.task_id, r ->> 'approach' AS approach, r ->> 'reason' AS reason,
           tsvector_to_array(to_tsvector('english', coalesce(r ->> 'approach', ''))) AS words
    FROM journal j, jsonb_array_elements(
        CASE WHEN jsonb_typeof(j.payload -> 'ruled_out') = 'array' THEN j.payload -> 'ruled_out' ELSE '[]' END) r
    WHERE j.event_type = 'handoff'
      AND (j.task_id = %(scope)s OR j.session_id = %(scope)s OR j.project_id = %(scope)s
           OR j.task_id IN (SELECT t.id FROM tasks t JOIN tasks p ON p.id = t.parent_task_id
                            WHERE p.session_id = %(scope)s))
)
SELECT r.seq, r.task_id, r.approach, r.reason,
       (SELECT count(*) FROM unnest(r.words) w WHERE w = ANY (c.words))::float
           / greatest(cardinality(r.words), 1) AS overlap
FROM rule_outs r, candidate c
WHERE cardinality(r.words) > 0
ORDER BY overlap DESC, r.seq DESC
LIMIT 20
