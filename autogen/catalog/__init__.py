"""What autogen knows before it measures: the pretuned catalog shipped in data/, the
environment a winner was measured in (stale or not), the memo of rendered source hashes and the
rules for which stored rows are usable. Imports base, core and tuning_db."""
