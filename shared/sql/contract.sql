-- name: active_contract --
SELECT id, field_key, required, read_by, semantics, shape, supersedes, retired, created_at
FROM contract_active ORDER BY id

-- name: all_contract --
SELECT id, field_key, required, read_by, semantics, shape, supersedes, retired, created_at
FROM contract ORDER BY id

-- name: contract_version --
SELECT coalesce(max(id), 0) FROM contract

-- name: current_field --
SELECT id FROM contract_active WHERE field_key = %(field_key)s

-- name: insert_contract_field --
INSERT INTO contract (field_key, required, read_by, semantics, shape, supersedes, retired)
VALUES (%(field_key)s, %(required)s, %(read_by)s, %(semantics)s, %(shape)s, %(supersedes)s, %(retired)s)
RETURNING id
