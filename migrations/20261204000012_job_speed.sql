-- A job's `speed` (CosyVoice2: its audio 1/speed as long); NULL is 1. Part of what a job id
-- stands for: the same id with another speed is a conflict, as another text or voice is.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS speed double precision;
