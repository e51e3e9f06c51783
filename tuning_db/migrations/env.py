"""Alembic environment: runs on the connection the caller passed, inside its transaction."""

from __future__ import annotations

from alembic import context

from tuning_db.migrations import VERSION_TABLE
from tuning_db.models import Base


def include_name(name: str | None, type_: str, parent_names: dict) -> bool:
    """Autogenerate compares only autogen's own tables: other tools may share the database."""
    return type_ != "table" or bool(name and name.startswith("autogen_"))


def run_migrations() -> None:
    connection = context.config.attributes.get("connection")
    if connection is None:
        raise RuntimeError(
            "tuning_db migrations need a live connection in config.attributes['connection']; "
            "use tuning_db.upgrade(url)"
        )
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        render_as_batch=True,  # SQLite cannot ALTER most things; batch mode rebuilds the table
        include_name=include_name,
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
