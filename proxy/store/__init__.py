"""PostgreSQL, the one room with SQL: every statement named in ``queries.sql``, numbered
migrations, the asyncpg ``Store`` (pool, transactions, error translation), the embedded
server for development, and ``operation``, the operation row as the store returns it.

May import: errors only. Imported by every other package.
"""
