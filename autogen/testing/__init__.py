"""Test aids. Nothing here is used by autogen itself, and nothing here ever produces a reported
figure: they exist so that search, storage and the CLI can be tested without a GPU."""
