-- Fencing a job's claim (issue 39, item 8). A claim's number is `jobs.attempts` after the claim
-- that made it (each claim adds one under the row's lock), and the claim's audio is stored under a
-- key of its own (`storage::object_key`): a worker whose claim was taken over while it was frozen
-- neither overwrites the audio of the claim that replaced it nor commits (its `done` update requires
-- its claim number). `audio_bytes` is the stored object's size, which `voxbatch audit` compares with
-- the store's listing (`--deep` also hashes each object against `audio_sha256`).
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS audio_bytes bigint;

-- The campaign a rejected message named (issue 39, items 1 and 12): its `rejected` or `failed` job
-- row is filed under it, not under `default`; NULL when the message named none that was valid.
ALTER TABLE rejections ADD COLUMN IF NOT EXISTS campaign text;

-- Jobs a batch synthesized whose claim another delivery had taken over by its commit (its worker was
-- paused past its lease): not committed by it. The batch keeps its whole cost, spread over the jobs
-- it did commit (`audio_seconds` counts those), and `batch_size` the jobs it synthesized.
ALTER TABLE batches ADD COLUMN IF NOT EXISTS superseded integer NOT NULL DEFAULT 0;
