-- What the user did survives restarts: an archived thread stays archived, and no turn starts in it.

-- A thread's lifecycle is written by the supervisor as its turns start and end (running, idle...): once
-- the user archived the thread, those writes leave it archived.
CREATE FUNCTION sessions_keep_archived() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.lifecycle = 'archived' THEN
        NEW.lifecycle := 'archived';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER sessions_keep_archived BEFORE UPDATE ON sessions
    FOR EACH ROW EXECUTE FUNCTION sessions_keep_archived();

-- No turn is queued in an archived thread, whoever queues it (a chat delivery, the re-run of a turn an
-- executor's stop cut off, the policy's retry): the row is silently not inserted, so `INSERT ... RETURNING`
-- returns nothing, as when another run already repeats the turn.
CREATE FUNCTION tasks_no_turn_in_archived_thread() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.role = 'orchestrator' AND NEW.status = 'pending' AND NEW.session_id IS NOT NULL
       AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = NEW.session_id AND s.lifecycle = 'archived') THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER tasks_no_turn_in_archived_thread BEFORE INSERT ON tasks
    FOR EACH ROW EXECUTE FUNCTION tasks_no_turn_in_archived_thread();

-- the questions a (re-run) turn may take over: a thread's pending ones, by identical content
CREATE INDEX IF NOT EXISTS questions_pending_session_idx ON questions (source_session_uuid) WHERE status = 'pending';
