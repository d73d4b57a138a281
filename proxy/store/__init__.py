"""PostgreSQL, the one room with SQL: every statement named in ``queries.sql``, with named
parameters (loaded, and run by name with keyword arguments, by ``queries``), numbered migrations
(``migrate``) and the current ``schema`` they build (``schema.sql``, generated from them), the
asyncpg ``Store`` of ``store`` (transactions, error translation: a unique violation by its
constraint, once) and its ``connections`` (asyncpg's pool, with a connection that ended its call
cleanly handed to the next call), ``locks``, opgate's advisory locks in one key space and the
one "lock, count, insert" transaction, the ``embedded`` server for development, ``operation``
and ``proposal``, the rows as the store returns them (and ``Approval``, an approval's fields,
defined once), ``faults``, which errors mean the store cannot be reached or used (one
classification for every caller that runs SQL), ``dsn``, whether a database URL follows the
primary, ``replication``, whether a commit survives a failover, ``promotion``, whether a
promotion can have lost an acknowledged claim (the proof), ``readiness``, the connection
``/readyz`` checks on (outside the pool, under a deadline), and the statements of the rooms
above, one module per job: ``audit`` (the audit log's appends, checkpoints and reads),
``transparency`` (the Merkle tree's leaves, nodes, signed checkpoints and cosignatures),
``console`` (the console's sessions and pages), ``mandates`` (operations under signed mandates,
revoked mandates), ``x402`` (the one payment signed for an operation) and ``metrics`` (the
scrape's counts). No other package runs SQL.

May import: errors only. Imported by every other package.
"""
