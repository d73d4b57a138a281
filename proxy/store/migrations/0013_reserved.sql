-- 0013: reserved for another branch of this work (timelines are 0014). This placeholder keeps
-- the numbering without gaps on this branch only; delete it when the real 0013 is merged
-- (load_migrations refuses two files of one number, so a forgotten placeholder fails loudly).
SELECT 1;
