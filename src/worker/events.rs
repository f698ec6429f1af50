//! Completion events: after a batch's rows commit, each settled job's event goes to the topic
//! exchange `amqp.events_exchange` (routing keys `job.done.<campaign>`, `job.failed.<campaign>`,
//! `job.cancelled.<campaign>`, `job.rejected.<campaign>`, and `campaign.drained.<campaign>` each
//! time a campaign has nothing left), JSON as docs/event.schema.json describes.
//!
//! One path publishes them: a sweep that claims pending events in Postgres (`db::events`),
//! publishes each with a confirm, and marks it. The commit stage wakes it after every batch (job
//! events); every `worker.events_sweep` a full sweep also publishes what a crash or an outage left
//! pending, polls the queue depths and announces drained campaigns — at least once (an event may
//! repeat after a crash), never missing for a settled job. The broker being down delays events; it
//! never holds up synthesis.
//!
//! Neighbours: `commit` (wakes the sweep), `db::events` (pending events), `queue` (confirmed
//! publishing).

use std::sync::Arc;
use std::time::Duration;

use lapin::options::ConfirmSelectOptions;
use lapin::{BasicProperties, Channel, Connection};
use serde::Serialize;
use tokio::sync::Notify;
use tracing::{debug, warn};
use uuid::Uuid;

use crate::config::AmqpConfig;
use crate::db::events::JobEvent;
use crate::db::Db;
use crate::queue::{self, QueueError};

/// Events claimed per round.
const ROUND: i64 = 500;
/// How long a claimed event is left to its sweep before another may publish it.
const CLAIM_FOR: Duration = Duration::from_secs(60);

/// A completion event's body (docs/event.schema.json).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Event {
    /// `job.done`, `job.failed`, `job.cancelled`, `job.rejected` or `campaign.drained`.
    pub event: &'static str,
    pub campaign: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audio_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audio_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub characters: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When the job settled (RFC 3339); for a drain, when the event was made.
    pub at: String,
}

impl Event {
    fn of_job(e: &JobEvent, audio_url: impl Fn(&str) -> String) -> Event {
        let done = e.status == "done";
        Event {
            event: match e.status.as_str() {
                "done" => "job.done",
                "cancelled" => "job.cancelled",
                "rejected" => "job.rejected",
                _ => "job.failed",
            },
            campaign: e.campaign.clone(),
            job_id: Some(e.job_id),
            audio_url: e.s3_key.as_deref().filter(|_| done).map(audio_url),
            audio_seconds: e.audio_seconds.filter(|_| done),
            characters: Some(e.chars),
            cost_usd: e.cost_usd,
            batch_id: e.batch_id,
            error: e.error.clone().filter(|_| !done),
            at: e.finished_at.unwrap_or_else(chrono::Utc::now).to_rfc3339(),
        }
    }

    fn drained(campaign: &str) -> Event {
        Event { event: "campaign.drained", campaign: campaign.to_string(), at: chrono::Utc::now().to_rfc3339(), ..Event::default() }
    }

    /// `job.done.<campaign>` etc.
    pub fn routing_key(&self) -> String {
        format!("{}.{}", self.event, self.campaign)
    }
}

/// The sweep: its Postgres, its broker channel (opened when first needed, again after a failure).
pub struct EventSweep {
    pub db: Db,
    pub amqp: AmqpConfig,
    /// Forms an event's audio URL from the object key.
    pub audio_url: Arc<dyn Fn(&str) -> String + Send + Sync>,
    pub every: Duration,
    pub wake: Arc<Notify>,
    connection: Option<(Connection, Channel)>,
}

impl EventSweep {
    pub fn new(db: Db, amqp: AmqpConfig, audio_url: Arc<dyn Fn(&str) -> String + Send + Sync>, every: Duration, wake: Arc<Notify>) -> EventSweep {
        EventSweep { db, amqp, audio_url, every, wake, connection: None }
    }

    /// A worker's sweep: `cfg`'s exchange and period, each job's audio address from `storage`.
    pub fn for_worker(cfg: &crate::config::Config, db: Db, storage: crate::storage::Storage, wake: Arc<Notify>) -> EventSweep {
        EventSweep::new(db, cfg.amqp.clone(), Arc::new(move |key: &str| storage.url(key)), cfg.worker.events_sweep, wake)
    }

    /// Publishes a commit's job events when woken; every `every` (and once more when `stop` is
    /// cancelled, for the worker's last batch) a full sweep, which also polls the queue depths
    /// and announces drained campaigns — those look at more than one batch, so not per commit.
    pub async fn run(mut self, stop: tokio_util::sync::CancellationToken) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = self.wake.notified() => self.publish_logged(false).await,
                _ = tick.tick() => self.sweep().await,
                _ = stop.cancelled() => {
                    self.sweep().await;
                    return;
                }
            }
        }
    }

    /// Publishes every pending event it can now, drains included; failures are logged and left
    /// for the next sweep.
    pub async fn sweep(&mut self) {
        self.publish_logged(true).await;
    }

    async fn publish_logged(&mut self, full: bool) {
        if let Err(e) = self.publish_pending(full).await {
            warn!(error = %crate::worker::error_chain(&e), "completion events not published yet; the next sweep retries");
            self.connection = None;
        }
    }

    async fn publish_pending(&mut self, full: bool) -> Result<(), SweepError> {
        loop {
            let events = self.db.claim_job_events(ROUND, CLAIM_FOR).await?;
            if events.is_empty() {
                break;
            }
            let channel = self.channel().await?;
            let mut published = Vec::with_capacity(events.len());
            for e in &events {
                let event = Event::of_job(e, |key| (self.audio_url)(key));
                let result = publish(&channel, &self.amqp, &event).await;
                if let Err(err) = result {
                    // What was confirmed so far is marked; the rest stays claimed until it expires.
                    self.db.job_events_published(&published).await?;
                    return Err(err.into());
                }
                published.push(e.job_id);
            }
            self.db.job_events_published(&published).await?;
            debug!(events = published.len(), "completion events published");
            if (events.len() as i64) < ROUND {
                break;
            }
        }
        if !full {
            return Ok(());
        }
        let channel = self.channel().await?;
        // The depths also feed the metrics endpoint's gauge (one poll, every sweep).
        let queue_empty = queue::queue_depths(&channel, &self.amqp)
            .await
            .map(|(ready, dead)| {
                crate::metrics::queue_depths(ready, dead);
                ready == 0
            })
            .unwrap_or(false);
        for campaign in self.db.due_drains(queue_empty).await? {
            publish(&channel, &self.amqp, &Event::drained(&campaign)).await?;
            self.db.drain_published(&campaign).await?;
        }
        Ok(())
    }

    async fn channel(&mut self) -> Result<Channel, QueueError> {
        if let Some((conn, channel)) = &self.connection {
            if conn.status().connected() && channel.status().connected() {
                return Ok(channel.clone());
            }
        }
        let conn = queue::connect(&self.amqp, "voxbatch events").await?;
        let channel = conn.create_channel().await.map_err(|source| QueueError::Amqp { op: "channel.open", source })?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|source| QueueError::Amqp { op: "confirm.select", source })?;
        self.connection = Some((conn, channel.clone()));
        Ok(channel)
    }
}

async fn publish(channel: &Channel, amqp: &AmqpConfig, event: &Event) -> Result<(), QueueError> {
    let body = serde_json::to_vec(event).unwrap_or_default();
    let props = BasicProperties::default().with_delivery_mode(2).with_content_type("application/json".into());
    queue::publish_confirmed(channel, &amqp.events_exchange, &event.routing_key(), false, &body, props, "event publish", event.job_id).await
}

#[derive(Debug, thiserror::Error)]
enum SweepError {
    #[error(transparent)]
    Db(#[from] crate::db::DbError),
    #[error(transparent)]
    Queue(#[from] QueueError),
}
