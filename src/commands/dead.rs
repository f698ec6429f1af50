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
//! Neighbours: `queue::dead` (the walk), `db::dead` (histories and the requeue record).

use serde::Serialize;

use super::{open_db, CommandError};
use crate::config::Config;
use crate::queue::{self, dead::{DeadLetter, DeadLetters}};

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
#[derive(Debug, Clone, Serialize)]
pub struct DeadReport {
    /// Messages looked at.
    pub seen: usize,
    /// Matching messages, each with its outcome.
    pub rows: Vec<DeadRow>,
}

/// Walks the dead-letter queue and does `action` to every message matching `filter`.
pub async fn dead(cfg: &Config, filter: &DeadFilter, action: DeadAction) -> Result<DeadReport, CommandError> {
    let db = open_db(cfg).await?;
    let conn = queue::connect(&cfg.amqp, "voxbatch dead").await?;
    let mut walk = DeadLetters::open(&conn, &cfg.amqp).await?;
    let result = walk_queue(&db, &mut walk, filter, action).await;
    // Whatever happened, what was only looked at goes back (closing the connection would too).
    let given_back = walk.give_back().await;
    let _ = conn.close(200, "done".into()).await;
    let report = result?;
    given_back?;
    Ok(report)
}

/// Matching messages acted on at a time: their Postgres look-ups go together, and a requeue or
/// purge does not hold a whole queue of them unacknowledged first.
const CHUNK: usize = 256;

async fn walk_queue(db: &crate::db::Db, walk: &mut DeadLetters, filter: &DeadFilter, action: DeadAction) -> Result<DeadReport, CommandError> {
    let mut report = DeadReport { seen: 0, rows: Vec::new() };
    let mut exhausted = false;
    while !exhausted {
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
        act(db, walk, &letters, action, &mut report.rows).await?;
    }
    Ok(report)
}

/// Does `action` to `letters` and reports each.
async fn act(db: &crate::db::Db, walk: &mut DeadLetters, letters: &[DeadLetter], action: DeadAction, rows: &mut Vec<DeadRow>) -> Result<(), CommandError> {
    let ids: Vec<uuid::Uuid> = letters.iter().filter_map(|l| l.job_id).collect();
    let histories = db.job_histories(&ids).await?;
    let identities: Vec<String> = letters.iter().map(|l| l.identity()).collect();
    let already = if matches!(action, DeadAction::Requeue { dry_run: false }) { db.requeued(&identities).await? } else { Default::default() };
    for (letter, identity) in letters.iter().zip(&identities) {
        let outcome = match action {
            DeadAction::List => "listed",
            DeadAction::Requeue { dry_run: true } => "would-requeue",
            DeadAction::Requeue { dry_run: false } if already.contains(identity) => {
                walk.ack(letter).await?;
                "already-requeued"
            }
            DeadAction::Requeue { dry_run: false } => {
                walk.republish(letter).await?;
                db.record_requeue(identity, letter.job_id, letter.campaign.as_deref(), &letter.code).await?;
                walk.ack(letter).await?;
                "requeued"
            }
            DeadAction::Purge => {
                walk.ack(letter).await?;
                "purged"
            }
        };
        let history = letter.job_id.and_then(|id| histories.get(&id));
        rows.push(DeadRow {
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
    Ok(())
}

/// The report as a table.
pub fn dead_table(report: &DeadReport) -> String {
    let mut out = String::from("| job_id | campaign | code | dead-lettered at | attempts | requeues | outcome | reason |\n|---|---|---|---|---:|---:|---|---|\n");
    for r in &report.rows {
        let reason: String = r.reason.chars().take(80).collect();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.job_id.map(|j| j.to_string()).unwrap_or_else(|| "-".into()),
            r.campaign.as_deref().unwrap_or("-"),
            r.code,
            r.dead_lettered_at.as_deref().unwrap_or("-"),
            r.attempts.map(|a| a.to_string()).unwrap_or_else(|| "-".into()),
            r.requeues.map(|a| a.to_string()).unwrap_or_else(|| "-".into()),
            r.outcome,
            reason.replace('|', "/"),
        ));
    }
    out.push_str(&format!("{} matching of {} looked at\n", report.rows.len(), report.seen));
    out
}
