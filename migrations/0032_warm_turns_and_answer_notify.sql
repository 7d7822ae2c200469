-- Warm turns (executor/run/warm.py): a thread's next turn's process started ahead of its message, and its
-- end when no turn took it. Recorded for the operator (what it cost, why it ended); a turn that takes one
-- says so in its task.spawned (`warm`).
INSERT INTO event_types (name, tier, description) VALUES
    ('warm.started', 'raw', 'a thread''s next turn''s CLI was started ahead of its message, waiting on stdin (pid, spawn_id)'),
    ('warm.retired', 'raw', 'a warm turn''s process no turn took was ended (reason: idle, displaced, died, executor_stopping, spawn_differs, conversation_moved_on; its resident memory)')
ON CONFLICT (name) DO NOTHING;

-- A closed question's NOTIFY also carries how it closed, on `question_closed`, sent before the id-only
-- `question_answered` (a transaction's notifications arrive in the order sent): the asking tool returns the
-- answer without reading the row back (executor/asks.py). A row too large for NOTIFY's 8000-byte cap is not
-- carried; its waiter reads it, as every other listener still does.
CREATE OR REPLACE FUNCTION questions_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    closed text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM pg_notify('question_asked', NEW.id::text);
    ELSIF NEW.status <> OLD.status THEN
        closed := json_build_object('id', NEW.id, 'status', NEW.status, 'answers', NEW.answers,
                                    'response', NEW.response, 'answered_via', NEW.answered_via,
                                    'answered_by', NEW.answered_by)::text;
        IF octet_length(closed) <= 7900 THEN
            PERFORM pg_notify('question_closed', closed);
        END IF;
        PERFORM pg_notify('question_answered', NEW.id::text);
    END IF;
    RETURN NULL;
END;
$$;
