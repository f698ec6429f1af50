-- Jobs for CosyVoice2 token2wav models carry speech tokens instead of (or beside) text.
-- Stored as a JSON array so a resubmitted job id can be compared with what was claimed.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS speech_tokens jsonb;
COMMENT ON COLUMN jobs.speech_tokens IS 'speech token ids of a token2wav job (JSON array), NULL for text jobs';
