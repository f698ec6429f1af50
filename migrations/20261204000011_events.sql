-- Completion events (issue 17): a done or failed job's event is pending until the broker confirmed
-- it (event_published_at). A sweep claims pending events for a minute (event_claimed_at), publishes
-- them with confirms and marks them: at least once, never missing for a settled job.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS event_published_at timestamptz;
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS event_claimed_at timestamptz;
-- Jobs settled before events existed have nothing to announce.
UPDATE jobs SET event_published_at = coalesce(finished_at, now())
WHERE status IN ('done', 'failed') AND event_published_at IS NULL;
CREATE INDEX IF NOT EXISTS jobs_events_pending ON jobs (finished_at)
    WHERE event_published_at IS NULL AND status IN ('done', 'failed');
-- campaign.drained events: one per campaign once nothing of it is left (published_at when confirmed).
CREATE TABLE IF NOT EXISTS campaign_drains (
    campaign      text PRIMARY KEY,
    drained_at    timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz
);
