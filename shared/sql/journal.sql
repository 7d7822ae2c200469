-- name: advance_journal_head --
-- Reserve n seqs. The row lock is held until commit, so batches commit in seq order.
UPDATE journal_head SET last_seq = last_seq + %(n)s RETURNING last_seq

-- name: copy_journal --
COPY journal (event_id, seq, project_id, session_id, task_id, parent_id, message_id,
              event_type, tier, created_at, payload) FROM STDIN

-- name: notify_journal --
SELECT pg_notify('journal', %(seq)s)

-- name: find_event_seqs --
SELECT event_id, seq FROM journal WHERE event_id = ANY(%(ids)s)

-- name: find_unregistered_event_types --
SELECT p.name, p.tier
FROM unnest(%(names)s::text[], %(tiers)s::text[]) AS p(name, tier)
WHERE NOT EXISTS (SELECT 1 FROM event_types e WHERE e.name = p.name AND e.tier = p.tier)

-- name: register_event_type --
INSERT INTO event_types (name, tier, description) VALUES (%(name)s, %(tier)s, %(description)s)
ON CONFLICT (name) DO NOTHING

-- name: journal_head --
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
