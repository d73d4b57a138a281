-- placeholder: drop at merge. Branch auditdur only: 0013 and 0014 are other branches'
-- migrations; this keeps proxy/store/migrate.py's 1..n check passing for 0015 here. A
-- statement, not nothing: asyncpg fails on an empty query.
SELECT 1;
