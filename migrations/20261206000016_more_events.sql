-- Every settled job announces itself (issue 39): cancelled and rejected jobs get events too
-- (job.cancelled.<campaign>, job.rejected.<campaign>), so done + failed + cancelled + rejected
-- events add up to a campaign's jobs. Rows settled before this have nothing to announce.
UPDATE jobs SET event_published_at = coalesce(finished_at, now())
WHERE status IN ('cancelled', 'rejected') AND event_published_at IS NULL;
DROP INDEX IF EXISTS jobs_events_pending;
CREATE INDEX IF NOT EXISTS jobs_events_pending ON jobs (finished_at)
    WHERE event_published_at IS NULL AND status IN ('done', 'failed', 'cancelled', 'rejected');
-- A campaign drains again when jobs of it settle after its last drain (a requeued dead letter, a
-- resumed campaign): the drain row is renewed and announced once more.
