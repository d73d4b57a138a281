-- 0028: a placeholder in branch x402 only, so that 0029 (given to this branch) applies in its
-- tests; another branch's 0028 takes its place at merge, and this file is then deleted.
SELECT 1;
