-- Wake-ups a loop has work for, and no others. An answered question woke the settler's three answer passes
-- and each activity write (awaiting_user, then running again: two per answer) woke every executor loop that
-- waits for a task's end (settler, claude sessions, routine ends), some ten queries per answer that found
-- nothing, on the answer's way back to its asking tool.
--
-- `task_changed` now fires for a status change only (every end is one); an activity-only change is
-- `task_activity`, which the ingress takes as the same task signal for the page.
CREATE OR REPLACE FUNCTION tasks_notify_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status THEN
        PERFORM pg_notify('task_changed', NEW.id::text);
    ELSIF NEW.activity IS DISTINCT FROM OLD.activity THEN
        PERFORM pg_notify('task_activity', NEW.id::text);
    END IF;
    RETURN NULL;
END;
$$;

-- `question_settle` (the id) fires when a closed question is one the settler acts on: an approval's, an
-- escalation's (both recorded with their question, in its transaction) or one that had timed out (its late
-- answer goes to the thread). Questions whose asking tool is waiting are answered without it.
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
        IF NEW.timed_out_at IS NOT NULL
           OR EXISTS (SELECT 1 FROM approvals WHERE question_id = NEW.id)
           OR EXISTS (SELECT 1 FROM escalations WHERE question_id = NEW.id) THEN
            PERFORM pg_notify('question_settle', NEW.id::text);
        END IF;
    END IF;
    RETURN NULL;
END;
$$;
