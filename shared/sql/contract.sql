-- name: list_active_contract_fields --
SELECT id, field_key, required, read_by, semantics, shape, supersedes, retired, created_at
FROM contract_active ORDER BY id

-- name: get_contract_version --
SELECT coalesce(max(id), 0) AS version FROM contract

-- name: get_current_contract_field --
SELECT id FROM contract_active WHERE field_key = %(field_key)s

-- name: insert_contract_field --
INSERT INTO contract (field_key, required, read_by, semantics, shape, supersedes, retired)
VALUES (%(field_key)s, %(required)s, %(read_by)s, %(semantics)s, %(shape)s, %(supersedes)s, %(retired)s)
RETURNING id
