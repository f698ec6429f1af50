-- `voxbatch cancel --campaign C` (issue 17): a row here means workers ack the campaign's jobs
-- without synthesis (status 'cancelled'); `--resume` deletes it. Checked inside each batch's
-- claim transaction, so a cancel takes effect at the next claim of every worker.
CREATE TABLE IF NOT EXISTS campaign_cancels (
    campaign      text PRIMARY KEY,
    cancelled_at  timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE jobs DROP CONSTRAINT IF EXISTS jobs_status_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_check
    CHECK (status IN ('queued', 'running', 'done', 'failed', 'rejected', 'cancelled'));
