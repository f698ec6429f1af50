//! A campaign as its operator sees it. `voxbatch cancel --campaign C [--resume]` stops or restarts
//! it: the cancel is a row in Postgres that every worker's claim transaction reads (`db::claim`):
//! jobs of the campaign not yet done are marked `cancelled` and acked without synthesis; batches
//! already claimed finish. `voxbatch status --campaign C [--watch]` shows its progress: jobs by
//! status, what is done, the recent rate, the ETA at that rate, cost so far and projected.
//!
//! Neighbours: `db::claim` (where the cancel takes effect), `db::progress` (the figures).

use super::{open_db, CommandError};
use crate::config::Config;

/// Cancels `campaign` (or resumes it); `true` when that changed something.
pub async fn cancel(cfg: &Config, campaign: &str, resume: bool) -> Result<bool, CommandError> {
    crate::job::check_name(campaign).map_err(|e| CommandError::Usage(format!("campaign {campaign:?}: {e}")))?;
    let db = open_db(cfg).await?;
    Ok(if resume { db.resume_campaign(campaign).await? } else { db.cancel_campaign(campaign).await? })
}

/// A campaign's progress: its figures and what they imply at the recent rate.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CampaignProgress {
    pub campaign: String,
    pub figures: crate::db::progress::CampaignFigures,
    /// The larger of what `enqueue` published and what Postgres has rows for.
    pub total_jobs: i64,
    /// Jobs not settled yet (queued, running, or published and not claimed yet).
    pub remaining_jobs: i64,
    pub remaining_chars: i64,
    pub jobs_per_minute: f64,
    pub chars_per_second: f64,
    pub audio_seconds_per_second: f64,
    /// Seconds to drain at the recent rate: `None` without a recent rate (or when cancelled).
    pub eta_seconds: Option<f64>,
    /// Cost so far plus the remaining characters at the cost per character so far.
    pub cost_usd_projected: Option<f64>,
}

impl CampaignProgress {
    /// What `figures` imply.
    pub fn from_figures(campaign: &str, figures: crate::db::progress::CampaignFigures) -> CampaignProgress {
        let f = &figures;
        let total_jobs = f.enqueued_jobs.max(f.known_jobs);
        let remaining_jobs = (total_jobs - f.finished_jobs).max(0);
        let remaining_chars = (f.enqueued_chars.max(f.known_chars) - f.finished_chars).max(0);
        let per_second = |x: f64| if f.recent_seconds > 0.0 { x / f.recent_seconds } else { 0.0 };
        let chars_per_second = per_second(f.recent_chars as f64);
        let eta_seconds = match (f.cancelled, remaining_jobs) {
            (true, _) => None,
            (false, 0) => Some(0.0),
            _ if chars_per_second > 0.0 => Some(remaining_chars as f64 / chars_per_second),
            _ => None,
        };
        let cost_usd_projected = (f.done_chars > 0).then(|| f.cost_usd + remaining_chars as f64 * f.cost_usd / f.done_chars as f64);
        CampaignProgress {
            campaign: campaign.to_string(),
            total_jobs,
            remaining_jobs,
            remaining_chars,
            jobs_per_minute: per_second(f.recent_jobs as f64) * 60.0,
            chars_per_second,
            audio_seconds_per_second: per_second(f.recent_audio_seconds),
            eta_seconds,
            cost_usd_projected,
            figures,
        }
    }

    /// Nothing left to do: every job settled (or the campaign cancelled with nothing running).
    pub fn finished(&self) -> bool {
        let running = self.figures.by_status.iter().any(|(s, n)| s == "running" && *n > 0);
        !running && (self.remaining_jobs == 0 || self.figures.cancelled)
    }

    /// Several lines for people.
    pub fn text(&self) -> String {
        let f = &self.figures;
        let statuses: Vec<String> = f.by_status.iter().map(|(s, n)| format!("{s} {n}")).collect();
        let eta = match self.eta_seconds {
            Some(s) => format_duration(s),
            None if f.cancelled => "— (cancelled)".into(),
            None => "— (no job done in the window yet)".into(),
        };
        format!(
            "campaign {}{}\n  jobs: {} of {} settled ({}), {} remaining\n  done: {:.3} audio hours, {} characters\n  \
             rate (last {:.0} s): {:.1} jobs/min, {:.0} characters/s, {:.1} audio-s/s\n  ETA: {}\n  cost: ${:.4} so far, {}\n",
            self.campaign,
            if f.cancelled { " (CANCELLED)" } else { "" },
            f.finished_jobs,
            self.total_jobs,
            if statuses.is_empty() { "no rows yet".to_string() } else { statuses.join(", ") },
            self.remaining_jobs,
            f.done_audio_seconds / 3600.0,
            f.done_chars,
            f.recent_seconds,
            self.jobs_per_minute,
            self.chars_per_second,
            self.audio_seconds_per_second,
            eta,
            f.cost_usd,
            self.cost_usd_projected.map(|c| format!("${c:.4} projected")).unwrap_or_else(|| "no projection before a job is done".into()),
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

/// `campaign`'s progress now, its rate over the last `window` (one look; `status --watch` keeps
/// one connection and calls [`CampaignProgress::read`]).
pub async fn campaign_progress(cfg: &Config, campaign: &str, window: std::time::Duration) -> Result<CampaignProgress, CommandError> {
    let db = open_db(cfg).await?;
    let progress = CampaignProgress::read(&db, campaign, window).await;
    db.pool().close().await;
    progress
}

impl CampaignProgress {
    /// `campaign`'s progress from `db`, its rate over the last `window`.
    pub async fn read(db: &crate::db::Db, campaign: &str, window: std::time::Duration) -> Result<CampaignProgress, CommandError> {
        Ok(CampaignProgress::from_figures(campaign, db.campaign_figures(campaign, window).await?))
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
        let p = CampaignProgress::from_figures("c", f.clone());
        assert_eq!((p.total_jobs, p.remaining_jobs, p.remaining_chars), (100, 60, 6_000));
        assert_eq!(p.eta_seconds, Some(300.0), "6,000 characters at 20 a second");
        assert_eq!(p.cost_usd_projected, Some(5.0), "$2 for 4,000 characters, 6,000 to go");
        assert!((p.jobs_per_minute - 12.0).abs() < 1e-9);
        assert!(!p.finished());
        assert!(CampaignProgress::from_figures("c", CampaignFigures { recent_seconds: 0.0, ..f.clone() }).eta_seconds.is_none());
        let cancelled = CampaignProgress::from_figures("c", CampaignFigures { cancelled: true, by_status: vec![], ..f.clone() });
        assert!(cancelled.eta_seconds.is_none() && cancelled.finished() && cancelled.text().contains("CANCELLED"));
        let done = CampaignProgress::from_figures("c", CampaignFigures { finished_jobs: 100, finished_chars: 10_000, by_status: vec![], ..f });
        assert_eq!((done.eta_seconds, done.finished()), (Some(0.0), true));
        assert_eq!(format_duration(3725.0), "1 h 2 min");
    }
}
