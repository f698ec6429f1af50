//! A campaign as its operator sees it. `voxbatch cancel --campaign C [--resume]` stops or restarts
//! it: the cancel is a row in Postgres that every worker's claim transaction reads (`db::claim`):
//! jobs of the campaign not yet done are marked `cancelled` and acked without synthesis; batches
//! already claimed finish. `voxbatch status --campaign C [--watch]` shows its progress: jobs by
//! status, what is done, the recent rate, the ETA at that rate, cost so far and projected — or,
//! for a campaign published by other clients, that its size is unknown until workers claim it.
//!
//! Neighbours: `db::claim` (where the cancel takes effect), `db::progress` (the figures).

use std::time::Duration;

use super::{open_db, CommandError};
use crate::config::Config;
use crate::job::escape_controls;
use crate::queue::{self, QueueError};
use crate::report::Render;

/// `campaign` if jobs can carry it, else a usage error saying why (an empty name would match
/// nothing, or everything).
fn checked(campaign: &str) -> Result<&str, CommandError> {
    crate::job::check_name(campaign).map_err(|e| CommandError::Usage(format!("--campaign {e}")))?;
    Ok(campaign)
}

/// Cancels `campaign` (or resumes it); `true` when that changed something.
pub async fn cancel(cfg: &Config, campaign: &str, resume: bool) -> Result<bool, CommandError> {
    let campaign = checked(campaign)?;
    let db = open_db(cfg).await?;
    Ok(if resume { db.resume_campaign(campaign).await? } else { db.cancel_campaign(campaign).await? })
}

/// What `cancel` says it did.
pub fn cancel_text(campaign: &str, resume: bool, changed: bool) -> String {
    let c = escape_controls(campaign);
    match (resume, changed) {
        (false, true) => format!("cancelled campaign {c}: workers ack its queued jobs without synthesis (status cancelled); batches running now finish\n"),
        (false, false) => format!("campaign {c} was already cancelled\n"),
        (true, true) => format!("resumed campaign {c}: its jobs not yet consumed are synthesized again\n"),
        (true, false) => format!("campaign {c} was not cancelled\n"),
    }
}

/// A campaign's progress: its figures and what they imply at the recent rate.
///
/// Its size is known when `enqueue` published it (`campaign_enqueues`). Jobs other clients
/// publish are not known until a worker claims them, and the queue cannot say which campaign a
/// message is of without taking it: then the size is *unknown* — the jobs counted are a lower
/// bound, and there is no ETA or projected cost (a projection over the jobs claimed so far would
/// grow with every claim) — and the campaign is finished only once nothing of it is queued or
/// running and the job queue has no ready message (as for its `campaign.drained` event).
#[derive(Debug, Clone, serde::Serialize)]
pub struct CampaignProgress {
    pub campaign: String,
    pub figures: crate::db::progress::CampaignFigures,
    /// Whether `total_jobs` is the campaign's size (`enqueue` recorded what it published) or only
    /// the jobs workers have claimed so far.
    pub total_known: bool,
    /// The larger of what `enqueue` published and what Postgres has rows for.
    pub total_jobs: i64,
    /// Of `total_jobs`, those not settled yet (queued, running, or published and not claimed yet).
    pub remaining_jobs: i64,
    pub remaining_chars: i64,
    /// Ready messages in the job queue, of every campaign (`None`: the broker could not be asked).
    pub queue_ready: Option<u32>,
    pub jobs_per_minute: f64,
    pub chars_per_second: f64,
    pub audio_seconds_per_second: f64,
    /// Seconds to drain at the recent rate: `None` without a recent rate, when cancelled, or when
    /// the size is unknown.
    pub eta_seconds: Option<f64>,
    /// Cost so far plus the remaining characters at the cost per character so far (`None` before
    /// a job is done or while the size is unknown).
    pub cost_usd_projected: Option<f64>,
}

impl CampaignProgress {
    /// What `figures` imply, with `queue_ready` ready messages in the job queue.
    pub fn from_figures(campaign: &str, figures: crate::db::progress::CampaignFigures, queue_ready: Option<u32>) -> CampaignProgress {
        let f = &figures;
        let total_known = f.enqueued_jobs > 0;
        let total_jobs = f.enqueued_jobs.max(f.known_jobs);
        let remaining_jobs = (total_jobs - f.finished_jobs).max(0);
        let remaining_chars = (f.enqueued_chars.max(f.known_chars) - f.finished_chars).max(0);
        let per_second = |x: f64| if f.recent_seconds > 0.0 { x / f.recent_seconds } else { 0.0 };
        let chars_per_second = per_second(f.recent_chars as f64);
        let eta_seconds = match (f.cancelled, total_known, remaining_jobs) {
            (true, _, _) | (false, false, _) => None,
            (false, true, 0) => Some(0.0),
            _ if chars_per_second > 0.0 => Some(remaining_chars as f64 / chars_per_second),
            _ => None,
        };
        let cost_usd_projected =
            (total_known && f.done_chars > 0).then(|| f.cost_usd + remaining_chars as f64 * f.cost_usd / f.done_chars as f64);
        CampaignProgress {
            campaign: campaign.to_string(),
            total_known,
            total_jobs,
            remaining_jobs,
            remaining_chars,
            queue_ready,
            jobs_per_minute: per_second(f.recent_jobs as f64) * 60.0,
            chars_per_second,
            audio_seconds_per_second: per_second(f.recent_audio_seconds),
            eta_seconds,
            cost_usd_projected,
            figures,
        }
    }

    /// Jobs of the campaign queued (claims given back) or running.
    fn in_flight(&self) -> i64 {
        self.figures.by_status.iter().filter(|(s, _)| s == "running" || s == "queued").map(|(_, n)| n).sum()
    }

    /// Nothing left to do: every job settled (or the campaign cancelled with nothing running).
    /// Of a campaign of unknown size: some job of it known, none in flight, and no message ready
    /// in the job queue.
    pub fn finished(&self) -> bool {
        let running = self.figures.by_status.iter().any(|(s, n)| s == "running" && *n > 0);
        if self.figures.cancelled {
            return !running;
        }
        if self.total_known {
            return !running && self.remaining_jobs == 0;
        }
        self.figures.known_jobs > 0 && self.in_flight() == 0 && self.remaining_jobs == 0 && self.queue_ready == Some(0)
    }

    fn statuses(&self) -> String {
        let statuses: Vec<String> = self.figures.by_status.iter().map(|(s, n)| format!("{s} {n}")).collect();
        if statuses.is_empty() {
            "no job claimed yet".to_string()
        } else {
            statuses.join(", ")
        }
    }

    /// "40 of 100 settled" or, of unknown size, "40 settled of 64 claimed so far".
    fn settled(&self) -> String {
        if self.total_known {
            format!("{} of {} settled", self.figures.finished_jobs, self.total_jobs)
        } else {
            format!("{} settled of {} claimed so far, total unknown", self.figures.finished_jobs, self.total_jobs)
        }
    }

    fn queue(&self) -> String {
        match self.queue_ready {
            Some(n) => format!("{n} message(s) ready in the job queue (all campaigns)"),
            None => "the job queue's depth is unknown (RabbitMQ unreachable)".to_string(),
        }
    }

    fn eta(&self) -> String {
        match self.eta_seconds {
            Some(s) => format_duration(s),
            None if self.figures.cancelled => "— (cancelled)".into(),
            None if !self.total_known => "— (the campaign's size is unknown)".into(),
            None => "— (no job done in the window yet)".into(),
        }
    }

    fn projection(&self) -> String {
        match self.cost_usd_projected {
            Some(c) => format!("${c:.4} projected"),
            None if !self.total_known => "no projection while the campaign's size is unknown".into(),
            None => "no projection before a job is done".into(),
        }
    }

    /// One line, for a log or a file (`status --watch` without a terminal).
    pub fn line(&self) -> String {
        format!(
            "{} campaign {}{}: {} ({}), {}, {:.1} jobs/min, ETA {}, cost ${:.4} so far, {}\n",
            chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ"),
            escape_controls(&self.campaign),
            if self.figures.cancelled { " (CANCELLED)" } else { "" },
            self.settled(),
            self.statuses(),
            self.queue(),
            self.jobs_per_minute,
            self.eta(),
            self.figures.cost_usd,
            self.projection(),
        )
    }
}

impl Render for CampaignProgress {
    /// Several lines for people.
    fn text(&self) -> String {
        let f = &self.figures;
        let size = if self.total_known {
            format!("{} remaining", self.remaining_jobs)
        } else {
            "jobs published without `voxbatch enqueue` are counted once a worker claims them".to_string()
        };
        format!(
            "campaign {}{}\n  jobs: {} ({}), {}\n  queue: {}\n  done: {:.3} audio hours, {} characters\n  \
             rate (last {:.0} s): {:.1} jobs/min, {:.0} characters/s, {:.1} audio-s/s\n  ETA: {}\n  cost: ${:.4} so far, {}\n",
            escape_controls(&self.campaign),
            if f.cancelled { " (CANCELLED)" } else { "" },
            self.settled(),
            self.statuses(),
            size,
            self.queue(),
            f.done_audio_seconds / 3600.0,
            f.done_chars,
            f.recent_seconds,
            self.jobs_per_minute,
            self.chars_per_second,
            self.audio_seconds_per_second,
            self.eta(),
            f.cost_usd,
            self.projection(),
        )
    }
}

fn format_duration(seconds: f64) -> String {
    let s = seconds.round() as u64;
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

/// The job queue's ready messages, asked on `broker` (connecting first when it is `None`);
/// `None` when the broker cannot be reached (the connection is dropped, to be made again next
/// time). A refusal of the credentials is an error.
async fn queue_ready(cfg: &Config, broker: &mut Option<(lapin::Connection, lapin::Channel)>) -> Result<Option<u32>, CommandError> {
    use crate::worker::retry::Transience;
    if broker.is_none() {
        let opened = async {
            let conn = queue::connect(&cfg.amqp, "voxbatch status").await?;
            let channel = conn.create_channel().await.map_err(|source| QueueError::Amqp { op: "channel.open", source })?;
            Ok::<_, QueueError>((conn, channel))
        };
        match opened.await {
            Ok(pair) => *broker = Some(pair),
            Err(e) if e.is_permanent() => return Err(e.into()),
            Err(_) => return Ok(None),
        }
    }
    let Some((_, channel)) = broker.as_ref() else { return Ok(None) };
    match queue::queue_depths(channel, &cfg.amqp).await {
        Ok((ready, _)) => Ok(Some(ready)),
        Err(_) => {
            *broker = None;
            Ok(None)
        }
    }
}

/// `campaign`'s progress now, its rate over the last `window` (one look).
pub async fn campaign_progress(cfg: &Config, campaign: &str, window: Duration) -> Result<CampaignProgress, CommandError> {
    let campaign = checked(campaign)?;
    let db = open_db(cfg).await?;
    let mut broker = None;
    let ready = queue_ready(cfg, &mut broker).await;
    let progress = match ready {
        Ok(ready) => CampaignProgress::read(&db, campaign, window, ready).await,
        Err(e) => Err(e),
    };
    if let Some((conn, _)) = broker {
        let _ = conn.close(200, "done".into()).await;
    }
    db.pool().close().await;
    progress
}

/// `status --campaign C --watch`: reads the campaign's progress every `every` and passes each
/// reading to `each` (the first at once), until it is [`CampaignProgress::finished`]; returns
/// the last. One Postgres connection and one broker connection for the whole watch (the broker
/// connection made again after a failure). A campaign nothing is known of yet is waited for.
pub async fn watch_campaign(
    cfg: &Config,
    campaign: &str,
    window: Duration,
    every: Duration,
    mut each: impl FnMut(&CampaignProgress),
) -> Result<CampaignProgress, CommandError> {
    let campaign = checked(campaign)?;
    let db = open_db(cfg).await?;
    let mut broker = None;
    loop {
        let ready = queue_ready(cfg, &mut broker).await?;
        let progress = CampaignProgress::read(&db, campaign, window, ready).await?;
        each(&progress);
        if progress.finished() {
            if let Some((conn, _)) = broker {
                let _ = conn.close(200, "done".into()).await;
            }
            return Ok(progress);
        }
        tokio::time::sleep(every).await;
    }
}

impl CampaignProgress {
    /// `campaign`'s progress from `db`, its rate over the last `window`, with `queue_ready`
    /// messages ready in the job queue.
    pub async fn read(db: &crate::db::Db, campaign: &str, window: Duration, queue_ready: Option<u32>) -> Result<CampaignProgress, CommandError> {
        Ok(CampaignProgress::from_figures(campaign, db.campaign_figures(campaign, window).await?, queue_ready))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::progress::CampaignFigures;

    #[test]
    fn eta_and_projection_follow_the_recent_rate_and_the_larger_total() {
        let f = CampaignFigures {
            by_status: vec![("done".into(), 40), ("running".into(), 10)],
            enqueued_jobs: 100,
            enqueued_chars: 10_000,
            known_jobs: 50,
            known_chars: 5_000,
            finished_jobs: 40,
            finished_chars: 4_000,
            done_jobs: 40,
            done_chars: 4_000,
            cost_usd: 2.0,
            recent_chars: 1_200,
            recent_jobs: 12,
            recent_seconds: 60.0,
            ..Default::default()
        };
        let p = CampaignProgress::from_figures("c", f.clone(), Some(0));
        assert_eq!((p.total_jobs, p.remaining_jobs, p.remaining_chars), (100, 60, 6_000));
        assert_eq!(p.eta_seconds, Some(300.0), "6,000 characters at 20 a second");
        assert_eq!(p.cost_usd_projected, Some(5.0), "$2 for 4,000 characters, 6,000 to go");
        assert!((p.jobs_per_minute - 12.0).abs() < 1e-9);
        assert!(!p.finished());
        assert!(CampaignProgress::from_figures("c", CampaignFigures { recent_seconds: 0.0, ..f.clone() }, Some(0)).eta_seconds.is_none());
        let cancelled = CampaignProgress::from_figures("c", CampaignFigures { cancelled: true, by_status: vec![], ..f.clone() }, Some(0));
        assert!(cancelled.eta_seconds.is_none() && cancelled.finished() && cancelled.text().contains("CANCELLED"));
        let done = CampaignProgress::from_figures("c", CampaignFigures { finished_jobs: 100, finished_chars: 10_000, by_status: vec![], ..f }, Some(0));
        assert_eq!((done.eta_seconds, done.finished()), (Some(0.0), true));
        assert_eq!(format_duration(3725.0), "1 h 2 min");
    }

    /// Jobs published by another client: `enqueue` recorded nothing, Postgres knows what workers
    /// claimed. Before any claim the campaign is not "0 of 0 settled, ETA 0 s" and not finished;
    /// while claims come in there is no ETA or projection that grows with them; it is finished
    /// once nothing of it is in flight and the job queue has no ready message.
    #[test]
    fn a_campaign_of_unknown_size_has_no_eta_or_projection_and_waits_for_the_queue() {
        let before = CampaignProgress::from_figures("pika", CampaignFigures { recent_seconds: 0.0, ..Default::default() }, Some(153));
        assert!(!before.total_known && !before.finished(), "nothing claimed yet, 153 queued: wait");
        assert_eq!((before.eta_seconds, before.cost_usd_projected), (None, None));
        let text = before.text();
        assert!(!text.contains("0 of 0") && !text.contains("ETA: 0 s"), "{text}");
        assert!(text.contains("total unknown") && text.contains("153 message(s) ready"), "{text}");
        // Claims arrive batch by batch at a steady cost per character: nothing projected from them.
        let claimed = |known: i64, done: i64, running: i64| CampaignFigures {
            by_status: [("done", done), ("running", running)].iter().filter(|(_, n)| *n > 0).map(|(s, n)| (s.to_string(), *n)).collect(),
            known_jobs: known,
            known_chars: known * 100,
            finished_jobs: done,
            finished_chars: done * 100,
            done_jobs: done,
            done_chars: done * 100,
            cost_usd: done as f64 * 0.01,
            recent_jobs: done,
            recent_chars: done * 100,
            recent_seconds: 60.0,
            ..Default::default()
        };
        for (known, done) in [(16, 0), (32, 16), (64, 32), (128, 96)] {
            let p = CampaignProgress::from_figures("pika", claimed(known, done, known - done), Some(40));
            assert_eq!((p.eta_seconds, p.cost_usd_projected), (None, None), "{known} claimed");
            assert!(!p.finished());
        }
        assert!(!CampaignProgress::from_figures("pika", claimed(153, 153, 0), Some(7)).finished(), "messages still ready");
        assert!(!CampaignProgress::from_figures("pika", claimed(153, 153, 0), None).finished(), "the broker not asked");
        let drained = CampaignProgress::from_figures("pika", claimed(153, 153, 0), Some(0));
        assert!(drained.finished() && drained.text().contains("153 settled of 153 claimed so far"), "{}", drained.text());
        // The same run published with `enqueue`: the size is known, the projection steady.
        let known = |done: i64| CampaignFigures { enqueued_jobs: 153, enqueued_chars: 15_300, ..claimed(done.max(16), done, 16) };
        let projections: Vec<f64> = [16, 32, 96, 150].iter().map(|&d| CampaignProgress::from_figures("e", known(d), Some(0)).cost_usd_projected.unwrap()).collect();
        assert!(projections.iter().all(|p| (p - 1.53).abs() < 1e-9), "{projections:?}");
    }
}
