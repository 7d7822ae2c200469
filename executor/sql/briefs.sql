-- name: list_attempt_tool_calls --
-- The tool calls one attempt made, oldest first, each with whether its result came back before the
-- attempt ended; `total` counts them all (the rows are bounded by %(limit)s).
SELECT c.block ->> 'name' AS name, c.block -> 'input' AS input, count(*) OVER () AS total,
       EXISTS (SELECT 1
               FROM journal r,
                    jsonb_array_elements(CASE WHEN jsonb_typeof(r.payload -> 'message' -> 'content') = 'array'
                                              THEN r.payload -> 'message' -> 'content' ELSE '[]' END) rb
               WHERE r.task_id = %(task_id)s AND r.event_type = 'stream.user'
                 AND rb ->> 'type' = 'tool_result' AND rb ->> 'tool_use_id' = c.block ->> 'id') AS finished
FROM journal j,
     jsonb_array_elements(CASE WHEN jsonb_typeof(j.payload -> 'message' -> 'content') = 'array'
                               THEN j.payload -> 'message' -> 'content' ELSE '[]' END) WITH ORDINALITY AS c(block, n)
WHERE j.task_id = %(task_id)s AND j.event_type = 'stream.assistant' AND c.block ->> 'type' = 'tool_use'
ORDER BY j.seq, c.n
LIMIT %(limit)s
