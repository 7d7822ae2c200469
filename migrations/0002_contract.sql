-- The handoff contract is data: one row per field. Rows are immutable and the set is append-only;
-- changing a field is a new row that supersedes the old one (field_key stays, never reused).
CREATE TABLE contract (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    field_key  text NOT NULL CHECK (field_key ~ '^[a-z][a-z0-9_]*$'),
    required   boolean NOT NULL DEFAULT false,
    read_by    text[] NOT NULL DEFAULT '{}',
    semantics  text NOT NULL,
    -- a JSON Schema fragment for the field's value
    shape      jsonb NOT NULL CHECK (jsonb_typeof(shape) = 'object'),
    supersedes bigint UNIQUE REFERENCES contract (id),
    -- a superseding row with retired = true removes the field from the active contract
    retired    boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION contract_check_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    prior_key text;
BEGIN
    IF NEW.supersedes IS NULL THEN
        IF EXISTS (SELECT 1 FROM contract WHERE field_key = NEW.field_key) THEN
            RAISE EXCEPTION 'contract field % already exists', NEW.field_key
                USING ERRCODE = 'unique_violation',
                      HINT = 'supersede it with a new row that names it in supersedes';
        END IF;
    ELSE
        SELECT field_key INTO prior_key FROM contract WHERE id = NEW.supersedes;
        IF prior_key IS DISTINCT FROM NEW.field_key THEN
            RAISE EXCEPTION 'contract row % defines %, not %', NEW.supersedes, prior_key, NEW.field_key
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER contract_insert_check
    BEFORE INSERT ON contract
    FOR EACH ROW EXECUTE FUNCTION contract_check_insert();
CREATE TRIGGER contract_append_only
    BEFORE UPDATE OR DELETE ON contract
    FOR EACH ROW EXECUTE FUNCTION refuse_change();
CREATE TRIGGER contract_no_truncate
    BEFORE TRUNCATE ON contract
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_change();

CREATE VIEW contract_active AS
SELECT c.*
FROM contract c
WHERE NOT c.retired
  AND NOT EXISTS (SELECT 1 FROM contract s WHERE s.supersedes = c.id);

INSERT INTO contract (field_key, required, read_by, semantics, shape) VALUES
    ('goal', true, '{harness,human}',
     'What the worker was asked to achieve, in one or two sentences.',
     '{"type": "string", "minLength": 1}'),
    ('current_state', true, '{harness,human}',
     'Where the work stands now: what is done and verified, what is not.',
     '{"type": "string", "minLength": 1}'),
    ('next_step', true, '{harness,human}',
     'The single most useful next action for whoever picks this up.',
     '{"type": "string"}'),
    ('ruled_out', true, '{harness,human}',
     'Approaches tried or considered and rejected, each with the reason; the list later briefs are checked against.',
     '{"type": "array", "items": {"type": "object", "required": ["approach", "reason"], "properties": {"approach": {"type": "string", "minLength": 1}, "reason": {"type": "string", "minLength": 1}}}}'),
    ('status', true, '{harness,human}',
     'The outcome as the work itself shows it.',
     '{"enum": ["success", "failed", "crashed", "cancelled", "rate_limited", "partial", "skipped", "gated", "extraction_failed"]}'),
    ('artifacts', false, '{harness,human}',
     'Commits, files, logs and references the work produced.',
     '{"type": "array", "items": {"type": "string"}}'),
    ('gate_decisions', false, '{harness,human}',
     'Autonomous-mode gate evidence: each decision point, the options on the table, the chosen option and what would have triggered a gate.',
     '{"type": "array", "items": {"type": "object", "required": ["decision_point", "chosen"], "properties": {"decision_point": {"type": "string"}, "options": {"type": "array", "items": {"type": "string"}}, "chosen": {"type": "string"}, "gate": {"type": "string"}, "reason": {"type": "string"}}}}');
