"""Alembic migrations of the memq run history (shipped inside the package).

Apply with `memq db upgrade`; `memq.store.schema` finds this directory through the package, so
it works from an installed wheel, not only from a checkout. From a checkout, plain Alembic also
works: `alembic -c migrations/alembic.ini upgrade head` (URL from MEMQ_DATABASE_URL).
"""
