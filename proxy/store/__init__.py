"""PostgreSQL, the one room with SQL: every statement named in ``queries.sql``, numbered
migrations, the asyncpg ``Store`` (transactions, error translation) and its ``connections``
(asyncpg's pool, with a connection that ended its call cleanly handed to the next call), the
embedded server for development, ``operation``, the operation row as the store returns
it, ``faults``, which errors mean the store cannot be reached or used (one classification for
every caller that runs SQL), and ``dsn``, whether a database URL follows the primary.

May import: errors only. Imported by every other package.
"""
