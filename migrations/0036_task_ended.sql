-- A task's end is a wake-up of its own. `task_changed` fired for every status change, so each claim
-- (pending -> running) woke every executor loop that waits for an end (the settler's passes, the claude-sessions
-- index with its walk of the conversation directories, the routines' run ends), some ten queries that found
-- nothing on the way to the turn's first line, beside the CLI's start on the same cores.
--
-- Now a status change into a final status (task_statuses.final) sends `task_ended`, any other status change
-- `task_changed`, an activity-only change `task_activity` (0035): one notification each, never two. The ingress
-- takes all three as the page's task signal.
CREATE OR REPLACE FUNCTION tasks_notify_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status THEN
        IF (SELECT final FROM task_statuses WHERE name = NEW.status) THEN
            PERFORM pg_notify('task_ended', NEW.id::text);
        ELSE
            PERFORM pg_notify('task_changed', NEW.id::text);
        END IF;
    ELSIF NEW.activity IS DISTINCT FROM OLD.activity THEN
        PERFORM pg_notify('task_activity', NEW.id::text);
    END IF;
    RETURN NULL;
END;
$$;
