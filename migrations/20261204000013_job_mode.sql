-- A CosyVoice2 text job's `mode` and `instruction` (NULL: not given). Part of what a job id stands
-- for, as its text, voice and speed are: the same id with another mode or instruction is a conflict.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS mode text;
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS instruction text;
