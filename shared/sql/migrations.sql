-- name: create_migrations_table --
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: lock_migrations --
-- Session-level: concurrent `migrate` runs on one database wait here for each other.
SELECT pg_advisory_lock(hashtext('petal-dispatch.migrate'))

-- name: unlock_migrations --
SELECT pg_advisory_unlock(hashtext('petal-dispatch.migrate'))

-- name: list_applied_migrations --
SELECT version, name, checksum FROM schema_migrations ORDER BY version

-- name: record_migration --
INSERT INTO schema_migrations (version, name, checksum) VALUES (%(version)s, %(name)s, %(checksum)s)

-- name: check_migrations_table_exists --
SELECT true AS holds WHERE to_regclass('schema_migrations') IS NOT NULL

-- name: update_migration_checksum --
-- an applied migration recorded with an earlier equivalent of the file's bytes (migrations/checksums.json)
UPDATE schema_migrations SET checksum = %(checksum)s WHERE version = %(version)s AND checksum = %(earlier)s
