-- name: list_approval_receipts --
-- Approvals with what then ran: a gate card's call as the CLI journaled it (its input, hashed by the caller
-- to compare with the approved hash) and its result; the task's status and cost (every stream.result of it).
SELECT r.id, r.kind, r.created_at, r.thread_id, r.task_id, r.question_id, r.tool_use_id, r.subject, r.answer,
       r.answered_by, r.approved_sha256, r.checked_sha256, r.matched, t.status AS task_status,
       ran.call, ran.result, cost.usd AS task_cost_usd
FROM approval_receipts r
JOIN tasks t ON t.id = r.task_id
LEFT JOIN LATERAL (
    SELECT (array_agg(b ORDER BY j.seq) FILTER (WHERE b ->> 'type' = 'tool_use'))[1] AS call,
           (array_agg(b ORDER BY j.seq) FILTER (WHERE b ->> 'type' = 'tool_result'))[1] AS result
    FROM journal j, jsonb_path_query(j.payload, '$.message.content[*] ? ((@.type == "tool_use" && @.id == $id) '
                                                '|| (@.type == "tool_result" && @.tool_use_id == $id))',
                                     jsonb_build_object('id', r.tool_use_id)) AS b
    WHERE r.tool_use_id IS NOT NULL AND j.task_id = r.task_id AND j.event_type IN ('stream.assistant', 'stream.user')
) ran ON true
LEFT JOIN LATERAL (
    SELECT sum(stream_cost_usd(j.payload))::float8 AS usd FROM journal j
    WHERE j.task_id = r.task_id AND j.event_type = 'stream.result'
) cost ON true
WHERE (%(thread_id)s::uuid IS NULL OR r.thread_id = %(thread_id)s::uuid)
  AND (%(task_id)s::uuid IS NULL OR r.task_id = %(task_id)s::uuid)
ORDER BY r.created_at, r.id
LIMIT %(limit)s
