-- What a spawn's output says of its cost and token use is summed for budgets, routine runs, receipts and usage.
-- A process inside the sandbox can write lines into that output as the CLI's own (its pipe, reopened through
-- /proc, or the CLI's memory): a value there is the spawn's word. A negative cost lowered what a run had spent
-- (its cap lifted), a string one failed the sums' cast. Summed through these: a number, at least 0 (and a cost
-- at most a million dollars a line), or 0.
CREATE FUNCTION stream_cost_usd(line jsonb) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN jsonb_typeof(line -> 'total_cost_usd') = 'number'
                THEN least(greatest((line ->> 'total_cost_usd')::numeric, 0), 1000000) ELSE 0 END
$$;

CREATE FUNCTION stream_count(value jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN jsonb_typeof(value) = 'number'
                THEN least(greatest(trunc((value #>> '{}')::numeric), 0), 1000000000000)::bigint ELSE 0 END
$$;
