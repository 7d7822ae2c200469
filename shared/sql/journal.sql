-- name: advance_journal_head --
-- Reserve n seqs. The row lock is held until commit, so batches commit in seq order. The NOTIFY is
-- queued here (saving a round trip per batch) and, like any NOTIFY, only sent if the batch commits.
UPDATE journal_head SET last_seq = last_seq + %(n)s RETURNING last_seq, pg_notify('journal', last_seq::text)

-- name: copy_journal --
COPY journal (event_id, seq, project_id, session_id, task_id, parent_id, message_id,
              event_type, tier, created_at, payload) FROM STDIN

-- name: find_event_seqs --
SELECT event_id, seq FROM journal WHERE event_id = ANY(%(ids)s)

-- name: find_unregistered_event_types --
SELECT p.name, p.tier
FROM unnest(%(names)s::text[], %(tiers)s::text[]) AS p(name, tier)
WHERE NOT EXISTS (SELECT 1 FROM event_types e WHERE e.name = p.name AND e.tier = p.tier)

-- name: register_event_type --
INSERT INTO event_types (name, tier, description) VALUES (%(name)s, %(tier)s, %(description)s)
ON CONFLICT (name) DO NOTHING

-- name: get_journal_head --
SELECT last_seq FROM journal_head

-- name: read_journal --
-- Events after a seq, in seq order; the optional filters are NULL when unused.
SELECT event_id, seq, project_id, session_id, task_id, parent_id, message_id,
       event_type, tier, created_at, payload
FROM journal
WHERE seq > %(after)s
  AND (%(task_id)s::uuid IS NULL OR task_id = %(task_id)s::uuid)
  AND (%(session_id)s::uuid IS NULL OR session_id = %(session_id)s::uuid)
ORDER BY seq
LIMIT %(limit)s

-- name: read_journal_page --
-- The SSE stream's page of events after a seq, in seq order: at most %(limit)s, and past the first only while the
-- payloads before each come to less than %(max_bytes)s as JSON text (a spawn's line can be 64 MiB: a page of such
-- rows is a few rows). `rows_in_page`: how many the count alone took; fewer returned means cut by size.
WITH head AS (
    SELECT seq, octet_length(payload::text) AS size
    FROM journal WHERE seq > %(after)s ORDER BY seq LIMIT %(limit)s
), sized AS (
    SELECT seq, sum(size) OVER (ORDER BY seq) - size AS before, count(*) OVER () AS rows_in_page FROM head
)
SELECT j.event_id, j.seq, j.project_id, j.session_id, j.task_id, j.parent_id, j.message_id,
       j.event_type, j.tier, j.created_at, j.payload, sized.rows_in_page
FROM sized JOIN journal j ON j.seq = sized.seq
WHERE sized.before < %(max_bytes)s
ORDER BY j.seq

-- name: read_journal_lines --
-- The journal as `petal-dispatch journal` shows it: one task's, or one thread's with the workers its
-- turns dispatched; the token-by-token stream events left out.
SELECT event_id, seq, project_id, session_id, task_id, parent_id, message_id, event_type, tier, created_at, payload
FROM journal
WHERE seq > %(after)s
  AND (%(task_id)s::uuid IS NULL OR task_id = %(task_id)s::uuid)
  AND (%(thread_id)s::uuid IS NULL OR session_id = %(thread_id)s::uuid
       OR task_id IN (SELECT id FROM tasks WHERE session_id = %(thread_id)s::uuid
                      UNION SELECT t.id FROM tasks t JOIN tasks p ON p.id = t.parent_task_id
                            WHERE p.session_id = %(thread_id)s::uuid))
  AND event_type <> 'stream.stream_event'
ORDER BY seq
LIMIT %(limit)s

-- name: append_small_batch --
-- A whole small batch in one statement (one round trip in autocommit): reserve seqs, insert, notify.
-- The head's row lock lasts until the statement's own commit, so commit order is still seq order.
-- The NOTIFY carries the batch's rows as they were stored (`<last_seq> <JSON array>`) when they fit well
-- under the 8000-byte cap, else only `<last_seq>`: the SSE fan-out then needs no read after it.
WITH head AS (
    UPDATE journal_head SET last_seq = last_seq + cardinality(%(event_ids)s::uuid[]) RETURNING last_seq
), inserted AS (
    INSERT INTO journal (event_id, seq, project_id, session_id, task_id, parent_id, message_id,
                         event_type, tier, created_at, payload)
    SELECT e.event_id, head.last_seq - cardinality(%(event_ids)s::uuid[]) + e.ord, e.project_id, e.session_id,
           e.task_id, e.parent_id, e.message_id, e.event_type, e.tier, e.created_at, e.payload::jsonb
    FROM head, unnest(%(event_ids)s::uuid[], %(project_ids)s::uuid[], %(session_ids)s::uuid[],
                      %(task_ids)s::uuid[], %(parent_ids)s::uuid[], %(message_ids)s::uuid[],
                      %(event_types)s::text[], %(tiers)s::text[], %(created_ats)s::timestamptz[],
                      %(payloads)s::text[])
         WITH ORDINALITY AS e(event_id, project_id, session_id, task_id, parent_id, message_id,
                              event_type, tier, created_at, payload, ord)
    RETURNING event_id, seq, project_id, session_id, task_id, parent_id, message_id, event_type, tier,
              created_at, payload
), body AS (
    SELECT json_agg(i ORDER BY i.seq)::text AS rows, count(*) AS n FROM inserted i
)
SELECT last_seq,
       pg_notify('journal', CASE WHEN octet_length(body.rows) <= 7900 THEN last_seq::text || ' ' || body.rows
                                 ELSE last_seq::text END),
       body.n
FROM head, body

-- name: list_event_types --
SELECT name, tier FROM event_types

-- name: lock_journal_head --
-- The head, locked until the transaction ends (a failover's check: shared/failover.py).
SELECT last_seq FROM journal_head FOR UPDATE

-- name: advance_journal_head_past --
-- Past seqs a new primary lacks that were seen committed on the old one: they are never given again.
UPDATE journal_head SET last_seq = %(seq)s WHERE last_seq < %(seq)s
