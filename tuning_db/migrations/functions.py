"""PostgreSQL functions of the tuning database, created by revision 0005 and by create_head.

autogen_claim_many decides a batch of claims on the server (TuningDB.claim_many): it takes the
problem's advisory lock, reads, decides each variant in order as tuning_db.repository's
_decide_claim does, writes the claim rows and returns one answer per variant, in one call, so the
lock is held for no client round trip. It runs in the caller's transaction, which keeps the lock
until its commit. A change to it needs a new revision that runs CLAIM_MANY again (CREATE OR
REPLACE); create_head creates the newest.

Each statement of a VOLATILE PL/pgSQL function in READ COMMITTED takes a new snapshot: the read
after pg_advisory_xact_lock sees every claim committed before the lock was granted (the lock and
the read in one statement would not: that statement's snapshot predates the wait).
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from tuning_db.models import COUNTED_TRIALS, RUNNING_CLAIMS

CLAIM_MANY_SIGNATURE = ("autogen_claim_many(text[], text[], text[], integer, text, text, text, text, bigint, "
                        "text, double precision, bigint, double precision, text)")

# The counts below state the partial indexes' conditions (tuning_db.models) word for word, so that
# the planner can use those indexes; the conditions are written once, there.
CLAIM_MANY = r"""
CREATE OR REPLACE FUNCTION autogen_claim_many(
    p_variants text[], p_kernel_names text[], p_params text[],
    p_gpu_id integer, p_family text, p_dtype text, p_shape_key text, p_cache_mode text,
    p_lock_key bigint, p_owner text, p_lease_s double precision, p_budget bigint,
    p_longest_lease_s double precision, p_stamp text)
RETURNS TABLE (claim_status text, claim_kernel_name text, claim_taken_over boolean, claim_previous text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now_s double precision;
    launched bigint;    -- stored trials (not rejected) plus running claims, lapsed ones included
    batch_rows autogen_claims[];    -- the batch's claim rows, as read under the lock
    stored text[];    -- the batch's kernel names stored (not rejected)
    claimed_here text[] := '{}';    -- variants inserted by this call: a second ask is "taken"
    r autogen_claims;
    has_row boolean;
    lease_left double precision;
    -- Python's (longest_lease_s or inf): NULL and 0 mean no bound; NaN bounds nothing out.
    longest double precision := CASE WHEN p_longest_lease_s IS NULL OR p_longest_lease_s = 0 THEN 'Infinity'
                                     WHEN p_longest_lease_s = 'NaN' THEN '-Infinity'
                                     ELSE p_longest_lease_s END;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);    -- a claim is a lease: see _lock_problem
    PERFORM pg_advisory_xact_lock(p_lock_key);
    SELECT extract(epoch FROM clock_timestamp())::double precision,
           (SELECT count(*) FROM autogen_trials t
             WHERE t.gpu_id = p_gpu_id AND t.family = p_family AND t.dtype = p_dtype
               AND t.shape_key = p_shape_key AND t.cache_mode = p_cache_mode AND t.COUNTED_TRIALS)
         + (SELECT count(*) FROM autogen_claims c
             WHERE c.gpu_id = p_gpu_id AND c.family = p_family AND c.dtype = p_dtype
               AND c.shape_key = p_shape_key AND c.cache_mode = p_cache_mode AND c.RUNNING_CLAIMS),
           ARRAY(SELECT c FROM autogen_claims c
                  WHERE c.gpu_id = p_gpu_id AND c.family = p_family AND c.dtype = p_dtype
                    AND c.shape_key = p_shape_key AND c.cache_mode = p_cache_mode AND c.variant = ANY(p_variants)),
           ARRAY(SELECT t.kernel_name FROM autogen_trials t
                  WHERE t.gpu_id = p_gpu_id AND t.family = p_family AND t.dtype = p_dtype
                    AND t.shape_key = p_shape_key AND t.cache_mode = p_cache_mode AND t.COUNTED_TRIALS
                    AND t.kernel_name = ANY(p_kernel_names))
      INTO now_s, launched, batch_rows, stored;
    FOR i IN 1 .. coalesce(array_length(p_variants, 1), 0) LOOP
        claim_status := 'claimed';
        claim_kernel_name := p_kernel_names[i];
        claim_taken_over := false;
        claim_previous := '';
        SELECT * INTO r FROM unnest(batch_rows) AS u WHERE u.variant = p_variants[i];
        has_row := FOUND;
        lease_left := CASE WHEN r.expires_at IS NULL OR r.expires_at IN ('NaN', 'Infinity', '-Infinity') THEN -1
                           ELSE r.expires_at - now_s END;
        IF p_variants[i] = ANY(claimed_here) THEN
            claim_status := 'taken';
        ELSIF has_row AND r.state = 'done' THEN
            claim_status := 'done';
            claim_kernel_name := r.kernel_name;
        ELSIF has_row AND lease_left > 0 AND lease_left <= longest AND r.owner IS DISTINCT FROM p_owner THEN
            claim_status := 'taken';
            claim_kernel_name := r.kernel_name;
        ELSIF p_kernel_names[i] = ANY(stored) THEN
            claim_status := 'done';
        ELSIF p_budget IS NOT NULL AND launched >= p_budget THEN
            claim_status := 'budget';
            claim_kernel_name := '';
        ELSIF NOT has_row THEN
            INSERT INTO autogen_claims (gpu_id, family, dtype, shape_key, cache_mode, variant, kernel_name, params,
                                        owner, state, expires_at, attempts, created_at, updated_at)
            VALUES (p_gpu_id, p_family, p_dtype, p_shape_key, p_cache_mode, p_variants[i], p_kernel_names[i],
                    p_params[i], p_owner, 'running', now_s + p_lease_s, 1, p_stamp, p_stamp);
            launched := launched + 1;    -- a lapsed claim taken over counted already
            claimed_here := claimed_here || p_variants[i];
        ELSE
            UPDATE autogen_claims
               SET kernel_name = p_kernel_names[i], params = p_params[i], owner = p_owner, state = 'running',
                   expires_at = now_s + p_lease_s, attempts = r.attempts + 1, updated_at = p_stamp
             WHERE id = r.id;
            claim_taken_over := r.owner IS DISTINCT FROM p_owner;
            claim_previous := r.owner;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$
""".replace("t.COUNTED_TRIALS", "t." + COUNTED_TRIALS).replace("c.RUNNING_CLAIMS", "c." + RUNNING_CLAIMS)


def create_functions(connection: Connection) -> None:
    """Create (or replace) the functions on PostgreSQL; nothing elsewhere."""
    if connection.dialect.name == "postgresql":
        connection.execute(text(CLAIM_MANY))


def drop_functions(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        connection.execute(text(f"DROP FUNCTION IF EXISTS {CLAIM_MANY_SIGNATURE}"))
