-- The derived layer: extractor tasks carry the schema they must produce; the failure record type.
ALTER TABLE tasks ADD COLUMN json_schema jsonb;

INSERT INTO event_types (name, tier, description) VALUES
    ('handoff.extraction_failed', 'derived', 'the extractor''s output failed the validation gate; holds the errors')
ON CONFLICT (name) DO NOTHING;

UPDATE role_profiles SET system_prompt =
    'You are the extractor of petal-dispatch. You read what a worker was asked and what it reported, and '
    'you return a structured handoff by calling the StructuredOutput tool exactly once. Report only what the '
    'worker''s own words support; leave a list empty rather than invent entries.'
WHERE role = 'extractor';

CREATE INDEX journal_task_tier_seq_idx ON journal (task_id, tier, seq);

-- whether a role's finished runs are distilled into handoffs (data, not a category in code)
ALTER TABLE role_profiles ADD COLUMN extract_on_exit boolean NOT NULL DEFAULT false;
UPDATE role_profiles SET extract_on_exit = true WHERE role = 'worker';
