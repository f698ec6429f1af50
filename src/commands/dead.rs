//! `voxbatch dead list | requeue | purge`: the dead-letter queue after a fix — see what is there
//! and why, send chosen jobs back to the job queue, or remove them.
//!
//! All three walk the queue once ([`queue::dead::DeadLetters`]) and act on the messages that
//! match the filter (campaign, rejection code), up to a limit; every message only looked at goes
//! back to the queue. `requeue` republishes with the broker's confirm, records the requeue in
//! Postgres, then acks the dead copy: interrupted anywhere, nothing is lost, and a second run acks
//! a copy whose requeue is already recorded instead of publishing it again. A job still bad comes
//! back to the dead-letter queue once, through the worker's ordinary rejection path.
//!
//! Interrupted by a signal, a walk stops after the message in hand and reports what it did; cut
//! off by the broker, it fails saying how many messages it had moved.
//!
//! Neighbours: `queue::dead` (the walk), `db::dead` (histories and the requeue record).

use std::future::Future;

use serde::Serialize;

use super::{open_db, CommandError};
use crate::config::Config;
use crate::queue::{self, dead::{DeadLetter, DeadLetters}};
use crate::report::{Render, Table};

/// Which dead-lettered messages a command acts on.
#[derive(Debug, Clone, Default)]
pub struct DeadFilter {
    pub campaign: Option<String>,
    pub code: Option<String>,
    /// At most this many matching messages (`None`: all).
    pub limit: Option<usize>,
}

/// What a dead command does with each matching message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadAction {
    List,
    Requeue { dry_run: bool },
    Purge,
}

/// One dead-lettered message as the commands report it.
#[derive(Debug, Clone, Serialize)]
pub struct DeadRow {
    pub job_id: Option<uuid::Uuid>,
    pub campaign: Option<String>,
    pub code: String,
    pub reason: String,
    pub dead_lettered_at: Option<String>,
    /// Claims by workers, requeues and rejections Postgres recorded for the job.
    pub attempts: Option<i32>,
    pub requeues: Option<i32>,
    pub rejections: Option<i64>,
    /// requeued, already-requeued (a copy an interrupted run left: acked), would-requeue
    /// (dry run), purged, or listed.
    pub outcome: &'static str,
}

/// What a walk did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DeadReport {
    /// Messages looked at.
    pub seen: usize,
    /// Matching messages, each with its outcome.
    pub rows: Vec<DeadRow>,
    /// Messages republished to the job queue and confirmed by the broker (`requeue`), counted as
    /// each confirm arrives: also the last one of a walk that stopped before recording it.
    pub requeued: usize,
    /// Messages removed for good (`purge`).
    pub purged: usize,
    /// A signal stopped the walk before every matching message was acted on.
    pub interrupted: bool,
}

impl DeadReport {
    /// What the walk moved, in words: "12 requeued to the job queue" or "3 purged".
    fn moved(&self) -> String {
        match (self.requeued, self.purged) {
            (0, 0) => "no message moved".to_string(),
            (r, 0) => format!("{r} message(s) requeued to the job queue (each confirmed by the broker)"),
            (0, p) => format!("{p} message(s) purged"),
            (r, p) => format!("{r} message(s) requeued, {p} purged"),
        }
    }
}

/// Walks the dead-letter queue and does `action` to every message matching `filter`.
pub async fn dead(cfg: &Config, filter: &DeadFilter, action: DeadAction) -> Result<DeadReport, CommandError> {
    dead_until(cfg, filter, action, std::future::pending()).await
}

/// [`dead`], stopping after the message in hand when `shutdown` resolves (the report says it was
/// interrupted). A walk that fails part-way (the broker connection lost) is an error that says
/// how many messages it had moved.
pub async fn dead_until(cfg: &Config, filter: &DeadFilter, action: DeadAction, shutdown: impl Future<Output = ()>) -> Result<DeadReport, CommandError> {
    let db = open_db(cfg).await?;
    let conn = queue::connect(&cfg.amqp, "voxbatch dead").await?;
    let mut walk = DeadLetters::open(&conn, &cfg.amqp).await?;
    let mut report = DeadReport::default();
    tokio::pin!(shutdown);
    let result = walk_queue(&db, &mut walk, filter, action, &mut report, shutdown).await;
    // Whatever happened, what was only looked at goes back (closing the connection would too).
    let given_back = walk.give_back().await;
    let _ = conn.close(200, "done".into()).await;
    match result {
        Err(e) if action != DeadAction::List && !matches!(action, DeadAction::Requeue { dry_run: true }) => Err(CommandError::PartWay {
            what: if action == DeadAction::Purge { "dead purge" } else { "dead requeue" },
            done: format!(
                "{}; run the same command again for the rest{}",
                report.moved(),
                if action == DeadAction::Purge { "" } else { " (a requeued message is not published twice)" }
            ),
            source: Box::new(e),
        }),
        Err(e) => Err(e),
        Ok(()) => {
            given_back?;
            Ok(report)
        }
    }
}

/// Matching messages acted on at a time: their Postgres look-ups go together, and a requeue or
/// purge does not hold a whole queue of them unacknowledged first.
const CHUNK: usize = 256;

async fn walk_queue(
    db: &crate::db::Db,
    walk: &mut DeadLetters,
    filter: &DeadFilter,
    action: DeadAction,
    report: &mut DeadReport,
    mut shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Result<(), CommandError> {
    use futures::FutureExt;
    let mut exhausted = false;
    while !exhausted && !report.interrupted {
        let mut letters = Vec::new();
        while letters.len() < CHUNK && filter.limit.is_none_or(|n| report.rows.len() + letters.len() < n) {
            let Some(letter) = walk.next().await? else {
                exhausted = true;
                break;
            };
            report.seen += 1;
            let matches = filter.campaign.as_ref().is_none_or(|c| letter.campaign.as_ref() == Some(c))
                && filter.code.as_ref().is_none_or(|c| &letter.code == c);
            if matches {
                letters.push(letter);
            }
        }
        if letters.is_empty() {
            break;
        }
        let ids: Vec<uuid::Uuid> = letters.iter().filter_map(|l| l.job_id).collect();
        let histories = db.job_histories(&ids).await?;
        let identities: Vec<String> = letters.iter().map(|l| l.identity()).collect();
        let already = if matches!(action, DeadAction::Requeue { dry_run: false }) { db.requeued(&identities).await? } else { Default::default() };
        for (letter, identity) in letters.iter().zip(&identities) {
            if action != DeadAction::List && shutdown.as_mut().now_or_never().is_some() {
                report.interrupted = true;
                break;
            }
            let outcome = act(db, walk, letter, identity, already.contains(identity), action, report).await?;
            let history = letter.job_id.and_then(|id| histories.get(&id));
            report.rows.push(DeadRow {
                job_id: letter.job_id,
                campaign: letter.campaign.clone(),
                code: letter.code.clone(),
                reason: letter.reason.clone(),
                dead_lettered_at: letter.dead_lettered_at.clone(),
                attempts: history.map(|h| h.attempts),
                requeues: history.map(|h| h.requeues),
                rejections: history.map(|h| h.rejections),
                outcome,
            });
        }
    }
    Ok(())
}

/// Does `action` to `letter`; returns its outcome.
async fn act(
    db: &crate::db::Db,
    walk: &mut DeadLetters,
    letter: &DeadLetter,
    identity: &str,
    already_requeued: bool,
    action: DeadAction,
    report: &mut DeadReport,
) -> Result<&'static str, CommandError> {
    Ok(match action {
        DeadAction::List => "listed",
        DeadAction::Requeue { dry_run: true } => "would-requeue",
        DeadAction::Requeue { dry_run: false } if already_requeued => {
            walk.ack(letter).await?;
            "already-requeued"
        }
        DeadAction::Requeue { dry_run: false } => {
            walk.republish(letter).await?;
            report.requeued += 1;
            db.record_requeue(identity, letter.job_id, letter.campaign.as_deref(), &letter.code).await?;
            walk.ack(letter).await?;
            "requeued"
        }
        DeadAction::Purge => {
            walk.ack(letter).await?;
            report.purged += 1;
            "purged"
        }
    })
}

impl DeadReport {
    /// The report as one table (every field escaped: campaigns, codes and reasons are the
    /// publisher's or a worker's words).
    pub fn table(&self) -> Table {
        let dash = || "-".to_string();
        let mut t = Table::new(["job_id", "campaign", "code", "dead_lettered_at", "attempts", "requeues", "outcome", "reason"]);
        for r in &self.rows {
            t.row([
                r.job_id.map(|j| j.to_string()).unwrap_or_else(dash),
                r.campaign.clone().unwrap_or_else(dash),
                r.code.clone(),
                r.dead_lettered_at.clone().unwrap_or_else(dash),
                r.attempts.map(|a| a.to_string()).unwrap_or_else(dash),
                r.requeues.map(|a| a.to_string()).unwrap_or_else(dash),
                r.outcome.to_string(),
                crate::job::truncate(&r.reason, 120),
            ]);
        }
        t
    }
}

impl Render for DeadReport {
    fn text(&self) -> String {
        let mut out = if self.rows.is_empty() { String::new() } else { self.table().to_string() };
        out.push_str(&format!("{} matching of {} looked at", self.rows.len(), self.seen));
        if self.requeued + self.purged > 0 {
            out.push_str(&format!("; {}", self.moved()));
        }
        out.push('\n');
        if self.interrupted {
            out.push_str("interrupted: the rest stay in the dead-letter queue; run the same command again to go on\n");
        }
        out
    }

    fn csv(&self) -> Option<String> {
        Some(self.table().csv())
    }
}
