-- 0029: a placeholder in branch failover only, so that 0030 (given to this branch) applies in
-- its tests; another branch's 0029 takes its place at merge, and this file is then deleted.
SELECT 1;
