-- The fleet: executors' leases, epochs and fencing.

-- name: lock_fleet_name --
-- Held on the lease's own session for the executor's life: a second executor of the same name refuses to
-- start (a dead holder's lock goes with its connection, so a restart after a crash is not refused).
SELECT pg_try_advisory_lock(hashtext('petal-dispatch.executor:' || %(name)s))

-- name: join_fleet --
-- (Re)join: a new epoch fences every write of a previous run of this name.
INSERT INTO executors (name, labels, capacity, epoch, lease_s, lease_until, version, started_at, renewed_at, sandbox,
                       workdir)
VALUES (%(name)s, %(labels)s, %(capacity)s, 1, %(lease_s)s, now() + make_interval(secs => %(lease_s)s),
        %(version)s, now(), now(), %(sandbox)s, %(workdir)s)
ON CONFLICT (name) DO UPDATE
SET labels = EXCLUDED.labels, capacity = EXCLUDED.capacity, epoch = executors.epoch + 1, sandbox = EXCLUDED.sandbox,
    workdir = EXCLUDED.workdir,
    lease_s = EXCLUDED.lease_s, lease_until = EXCLUDED.lease_until, version = EXCLUDED.version,
    started_at = now(), renewed_at = now(), lost_at = NULL, stopped_at = NULL
RETURNING epoch

-- name: renew_fleet_lease --
-- Refused once a survivor declared this run lost (or a newer run of the name joined): the run is fenced.
-- An expired lease nobody took over is renewed (a lone executor outlives a database outage).
UPDATE executors SET lease_until = now() + make_interval(secs => lease_s), renewed_at = now()
WHERE name = %(name)s AND epoch = %(epoch)s AND lost_at IS NULL AND stopped_at IS NULL
RETURNING epoch

-- name: leave_fleet --
UPDATE executors SET stopped_at = now(), lease_until = now()
WHERE name = %(name)s AND epoch = %(epoch)s AND lost_at IS NULL

-- name: reap_fleet_lease --
-- One survivor (the row update serialises them) takes over each executor whose lease expired: its running
-- tasks crash (executor_lost; the settler applies the policy), their credentials and pending questions die.
-- `at`: when, as the rows say it (lost_at, ended_at), for the records of the take-over.
WITH lost AS (
    UPDATE executors SET lost_at = now()
    WHERE lease_until < now() AND lost_at IS NULL AND stopped_at IS NULL AND name <> %(name)s
    RETURNING name, epoch, lease_until
), crashed AS (
    UPDATE tasks t SET status = 'crashed', status_reason = 'executor_lost', activity = NULL, ended_at = now()
    FROM lost WHERE t.executor_name = lost.name AND t.status = 'running'
    RETURNING t.id, t.session_id, t.project_id, t.executor_name
), revoked AS (
    UPDATE harness_credentials c SET revoked_at = now()
    FROM crashed WHERE c.task_id = crashed.id AND c.revoked_at IS NULL
    RETURNING 1
), cancelled AS (
    UPDATE questions q SET status = 'cancelled',
        response = 'the executor running the asking task (' || crashed.executor_name || ') was lost'
    FROM crashed WHERE q.task_id = crashed.id AND q.status = 'pending'
      AND NOT EXISTS (SELECT 1 FROM escalations e WHERE e.question_id = q.id)
    RETURNING q.id, q.task_id
)
SELECT 'executor' AS kind, name, epoch, lease_until, NULL::uuid AS id, NULL::uuid AS task_id,
       NULL::uuid AS session_id, NULL::uuid AS project_id, now() AS at FROM lost
UNION ALL
SELECT 'task', executor_name, NULL, NULL, id, id, session_id, project_id, now() FROM crashed
UNION ALL
SELECT 'question', NULL, NULL, NULL, id, task_id, NULL, NULL, now() FROM cancelled

-- name: get_fleet_name_staleness --
-- Whether a session still holding the name's lock is a dead one: the name's lease is not live, or it is
-- this very run's (its own earlier session, cut off half-open). No row yet: a namesake is joining.
SELECT coalesce((SELECT (e.epoch = %(epoch)s) IS TRUE OR e.lost_at IS NOT NULL OR e.stopped_at IS NOT NULL
                        OR e.lease_until < now()
                 FROM executors e WHERE e.name = %(name)s), false) AS stale

-- name: end_stale_fleet_holder --
-- A half-open or dead session keeps its advisory lock until the server notices (TCP keepalive, hours):
-- end the name's other lease sessions, which only a stale holder can have here.
SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE application_name = %(app)s AND pid <> pg_backend_pid()
