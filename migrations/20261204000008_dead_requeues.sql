-- Dead-lettered messages that `voxbatch dead requeue` republished (issue 17), one row per
-- dead-lettering (identity: job id, when it was dead-lettered, body digest). A requeue interrupted
-- between the broker's confirm and the ack of the dead copy leaves that copy in the dead-letter
-- queue: the next run finds its row here and acks it instead of publishing it a second time.
CREATE TABLE IF NOT EXISTS dead_requeues (
    identity     text PRIMARY KEY,
    job_id       uuid,
    campaign     text,
    code         text NOT NULL,
    requeued_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS dead_requeues_job_id ON dead_requeues (job_id);
-- How many times a job was requeued from the dead-letter queue.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS requeues integer NOT NULL DEFAULT 0;
