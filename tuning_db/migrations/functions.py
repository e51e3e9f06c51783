"""PostgreSQL functions of the tuning database, created by revisions 0005 and 0006 and by create_head.

autogen_claim_many decides a batch of claims on the server (TuningDB.claim_many): it takes the
problem's advisory lock, reads, decides each variant in order as tuning_db.repository's
_decide_claim does, writes the claim rows and returns one answer per variant, in one call, so the
lock is held for no client round trip. It runs in the caller's transaction, which keeps the lock
until its commit. A change to it needs a new revision that runs it again (CREATE OR REPLACE), and
the revisions before keep theirs (claim_many_sql); create_head creates the newest.

Each statement of a VOLATILE PL/pgSQL function in READ COMMITTED takes a new snapshot: the read
after pg_advisory_xact_lock sees every claim committed before the lock was granted (the lock and
the read in one statement would not: that statement's snapshot predates the wait).

The budget's count (revision 0006). The function counts a problem's launched variants: its stored
trials that are not rejected, plus its running claims. Counting the trials row by row under the
lock took longer the more the problem held (the heap is read while the table fills), and the
lock, one per problem, capped how many claims a second all workers together get. So the trials
are counted as they are written: statement triggers on autogen_trials add each statement's change
of a problem's count (rows that count, written, less rows that counted, replaced or deleted) to
autogen_trial_counts, in the writer's transaction, whoever writes (a claim completed, a trial
stored without a claim, a re-timing, a forced re-tune's delete). A problem's count is the sum of
its rows there, one per slot: each statement adds to a slot picked at random, so that concurrent
writers of one problem rarely wait for each other's row lock until they commit. The claim
function only reads them, and waits for no row lock: a writer's count and its trial become
visible together, at its commit, as the count(*) saw them. The running claims are still counted
row by row (a handful: the variants in flight). SQLite keeps counting in _CLAIMS_CHECK (an index
it reads without visiting the table: no cost growing with the trials that way).
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from tuning_db.models import COUNTED_TRIALS, RUNNING_CLAIMS

CLAIM_MANY_SIGNATURE = ("autogen_claim_many(text[], text[], text[], integer, text, text, text, text, bigint, "
                        "text, double precision, bigint, double precision, text)")

_CLAIM_MANY = r"""
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
           COUNTED_TRIALS_OF_PROBLEM + RUNNING_CLAIMS_OF_PROBLEM,
           ARRAY(SELECT c FROM autogen_claims c
                  WHERE c.PROBLEM AND c.variant = ANY(p_variants)),
           ARRAY(SELECT t.kernel_name FROM autogen_trials t
                  WHERE t.PROBLEM AND t.COUNTED_TRIALS AND t.kernel_name = ANY(p_kernel_names))
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
"""

TRIAL_COUNTS = "autogen_trial_counts"
SLOTS = 16  # rows a problem's count is spread over (module docstring)
PROBLEM = ("gpu_id", "family", "dtype", "shape_key", "cache_mode")
_PROBLEM = ", ".join(PROBLEM)


def _of_problem(alias: str) -> str:
    """The rows of ``alias`` of the claim function's problem (its p_* arguments)."""
    return " AND ".join(f"{alias}.{column} = p_{column}" for column in PROBLEM)


# The counts state the partial indexes' conditions (tuning_db.models) word for word, so that the
# planner can use those indexes; the conditions are written once, there.
COUNTED_BY_SCAN = f"(SELECT count(*) FROM autogen_trials t WHERE {_of_problem('t')} AND t.{COUNTED_TRIALS})"
COUNTED_BY_TRIGGERS = f"(SELECT coalesce(sum(n.counted), 0)::bigint FROM {TRIAL_COUNTS} n WHERE {_of_problem('n')})"
RUNNING = f"(SELECT count(*) FROM autogen_claims c WHERE {_of_problem('c')} AND c.{RUNNING_CLAIMS})"
# The problem's launched variants as the head's claim function reads them under the lock.
LAUNCHED = f"{COUNTED_BY_TRIGGERS} + {RUNNING}"


def claim_many_sql(counted_trials: str) -> str:
    """autogen_claim_many's CREATE OR REPLACE, counting the problem's stored trials (not rejected)
    with the expression ``counted_trials``: COUNTED_BY_SCAN (revision 0005) or COUNTED_BY_TRIGGERS."""
    return (_CLAIM_MANY.replace("COUNTED_TRIALS_OF_PROBLEM", counted_trials)
            .replace("RUNNING_CLAIMS_OF_PROBLEM", RUNNING).replace("t.COUNTED_TRIALS", f"t.{COUNTED_TRIALS}")
            .replace("c.PROBLEM", _of_problem("c")).replace("t.PROBLEM", _of_problem("t")))


CLAIM_MANY = claim_many_sql(COUNTED_BY_TRIGGERS)

# A statement's change to each problem's count: rows that count as written (new_rows) less those
# that counted before (old_rows), added to one slot, the problems in one order (two statements of
# several problems lock their rows in the same order). PostgreSQL gives a statement trigger of
# one event its transition tables: one trigger per event, one function for the four.
_ADD_CHANGE = f"""
        INSERT INTO {TRIAL_COUNTS} AS n ({_PROBLEM}, slot, counted)
        SELECT {_PROBLEM}, picked_slot, sum(change) FROM (CHANGED) AS changed
         GROUP BY {_PROBLEM} HAVING sum(change) <> 0 ORDER BY {_PROBLEM}
        ON CONFLICT ({_PROBLEM}, slot) DO UPDATE SET counted = n.counted + EXCLUDED.counted;"""
_WRITTEN = f"SELECT {_PROBLEM}, 1 AS change FROM new_rows WHERE {COUNTED_TRIALS}"
_REPLACED = f"SELECT {_PROBLEM}, -1 AS change FROM old_rows WHERE {COUNTED_TRIALS}"
TRIAL_COUNTS_DDL = (
    f"""CREATE TABLE {TRIAL_COUNTS} (
        gpu_id integer NOT NULL, family varchar(64) NOT NULL, dtype varchar(32) NOT NULL,
        shape_key varchar(256) NOT NULL, cache_mode varchar(8) NOT NULL, slot smallint NOT NULL,
        counted bigint NOT NULL,
        CONSTRAINT pk_{TRIAL_COUNTS} PRIMARY KEY ({_PROBLEM}, slot))""",
    f"""CREATE OR REPLACE FUNCTION autogen_count_trials() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        picked_slot smallint := floor(random() * {SLOTS});
    BEGIN
        IF TG_OP = 'INSERT' THEN{_ADD_CHANGE.replace("CHANGED", _WRITTEN)}
        ELSIF TG_OP = 'UPDATE' THEN{_ADD_CHANGE.replace("CHANGED", _WRITTEN + " UNION ALL " + _REPLACED)}
        ELSIF TG_OP = 'DELETE' THEN{_ADD_CHANGE.replace("CHANGED", _REPLACED)}
        ELSE
            DELETE FROM {TRIAL_COUNTS};    -- TRUNCATE
        END IF;
        RETURN NULL;
    END
    $$""",
    *(f"CREATE TRIGGER autogen_trials_count_{event.lower()} AFTER {event} ON autogen_trials {tables} "
      "FOR EACH STATEMENT EXECUTE FUNCTION autogen_count_trials()"
      for event, tables in (("INSERT", "REFERENCING NEW TABLE AS new_rows"),
                            ("UPDATE", "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows"),
                            ("DELETE", "REFERENCING OLD TABLE AS old_rows"), ("TRUNCATE", ""))),
    # The trials stored before the triggers: the triggers' lock on autogen_trials, held until the
    # migration commits, keeps any writer out between the two.
    f"""INSERT INTO {TRIAL_COUNTS} ({_PROBLEM}, slot, counted)
        SELECT {_PROBLEM}, 0, count(*) FROM autogen_trials WHERE {COUNTED_TRIALS} GROUP BY {_PROBLEM}""",
)


def create_functions(connection: Connection) -> None:
    """Create the head's functions on PostgreSQL (the trials' counts and the claim function, which
    reads them); nothing elsewhere."""
    if connection.dialect.name == "postgresql":
        create_trial_counts(connection)
        create_claim_function(connection, CLAIM_MANY)


def create_trial_counts(connection: Connection) -> None:
    """autogen_trial_counts, filled from the trials stored, and the triggers that keep it (PostgreSQL)."""
    for statement in TRIAL_COUNTS_DDL:
        connection.execute(text(statement))


def drop_trial_counts(connection: Connection) -> None:
    for event in ("insert", "update", "delete", "truncate"):
        connection.execute(text(f"DROP TRIGGER autogen_trials_count_{event} ON autogen_trials"))
    connection.execute(text("DROP FUNCTION autogen_count_trials()"))
    connection.execute(text(f"DROP TABLE {TRIAL_COUNTS}"))


def create_claim_function(connection: Connection, sql: str) -> None:
    """Create (or replace) autogen_claim_many as ``sql`` (claim_many_sql) on PostgreSQL."""
    if connection.dialect.name == "postgresql":
        connection.execute(text(sql))


def drop_functions(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        connection.execute(text(f"DROP FUNCTION IF EXISTS {CLAIM_MANY_SIGNATURE}"))
