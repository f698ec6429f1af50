-- What `voxbatch enqueue` published per campaign (issue 17), so that `status --campaign` knows a
-- campaign's size before workers have claimed its jobs: one row per (campaign, file digest, first
-- line published by the run), the run's confirmed jobs and their characters. A run again over the
-- same file and range updates its row (the larger count wins); `--skip N` is a new range.
CREATE TABLE IF NOT EXISTS campaign_enqueues (
    campaign    text NOT NULL,
    source      text NOT NULL,
    first_line  integer NOT NULL,
    jobs        bigint NOT NULL,
    chars       bigint NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (campaign, source, first_line)
);
