//! The held message: every way a delivery the worker holds can end goes through this file.
//!
//! - [`Delivery::ack`]: the job is settled (committed, already done, or a duplicate of one).
//! - [`Outbox::give_back`]: the worker returns messages that were not at fault (shutdown, an
//!   outage past the hold limit, a batch it could not start). A fresh copy is published with
//!   confirms and then the original acked, so giving back never spends the message's
//!   `x-delivery-limit` budget; that budget stays for messages that really crash workers. If the
//!   copy cannot be published the original is nacked with requeue (the broker keeps it).
//! - [`Outbox::dead_letter`]: published to the dead-letter exchange with its code and reason
//!   (confirmed), then acked; if that fails it is given back.
//! - [`Settler::reject`] / [`Settler::fail`]: record the reason in Postgres, then dead-letter.
//!
//! Dropping a delivery unsettled leaves it to the broker (redelivered when the channel closes).
//! Either way [`HeldCount`] goes down, which `--drain` and shutdown wait on.
//!
//! Neighbours: `intake` creates deliveries and rejects poison; `infer` settles conflicts, already
//! done jobs and failures; `commit` acks after the commit; `queue` publishes.

use std::sync::Arc;

use lapin::Acker;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicPublishOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};
use tokio::sync::{watch, RwLock};
use tracing::{debug, error, info, warn};
use uuid::Uuid;

use super::retry::Retry;
use super::Counters;
use crate::config::AmqpConfig;
use crate::db::Db;
use crate::job::{Rejection, RejectionKind};
use crate::queue::{self, QueueError};

/// Header counting how often workers gave a message back (informational).
pub const RETURNED_HEADER: &str = "x-voxbatch-returned";
/// Header counting how often a message reached the delivery limit without ever being claimed
/// (prefetched by workers that crashed or lost their connection before they started it) and was
/// given back with its count reset; at `delivery_limit` such returns it is failed like any other.
pub const UNCLAIMED_RETURNS_HEADER: &str = "x-voxbatch-unclaimed-returns";

/// The number of deliveries the worker holds; [`HeldCount::wait_zero`] resolves when it is 0.
#[derive(Clone)]
pub struct HeldCount(Arc<watch::Sender<usize>>);

impl Default for HeldCount {
    fn default() -> Self {
        HeldCount(Arc::new(watch::channel(0).0))
    }
}

impl HeldCount {
    pub fn get(&self) -> usize {
        *self.0.borrow()
    }
    fn add(&self) {
        self.0.send_modify(|n| *n += 1);
    }
    fn sub(&self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
    /// Resolves once every held delivery is settled or dropped.
    pub async fn wait_zero(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }
}

/// A message the worker holds.
pub struct Delivery {
    acker: Acker,
    body: Vec<u8>,
    properties: BasicProperties,
    /// The broker's redelivered flag: set when this message was delivered before and not settled.
    redelivered: bool,
    held: HeldCount,
}

impl Delivery {
    /// Takes a delivery from the consumer (counted as held until settled or dropped).
    pub fn hold(d: lapin::message::Delivery, held: &HeldCount) -> Delivery {
        held.add();
        Delivery { acker: d.acker, body: d.data, properties: d.properties, redelivered: d.redelivered, held: held.clone() }
    }

    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// How often the broker delivered this message before without it being settled
    /// (`x-delivery-count`: crashed workers, lost connections; give-backs do not count). Read only
    /// on a redelivery: on a first delivery the header can only be the publisher's, and a
    /// publisher-set count must not fail a job it never ran.
    pub fn previous_deliveries(&self) -> u64 {
        if !self.redelivered {
            return 0;
        }
        let Some(headers) = self.properties.headers() else { return 0 };
        match headers.inner().get("x-delivery-count") {
            Some(AMQPValue::LongLongInt(n)) => u64::try_from(*n).unwrap_or(0),
            Some(AMQPValue::LongInt(n)) => u64::try_from(*n).unwrap_or(0),
            Some(AMQPValue::LongUInt(n)) => u64::from(*n),
            Some(AMQPValue::ShortInt(n)) => u64::try_from(*n).unwrap_or(0),
            Some(AMQPValue::ShortShortInt(n)) => u64::try_from(*n).unwrap_or(0),
            Some(AMQPValue::Timestamp(n)) => *n,
            _ => 0,
        }
    }

    /// Acks; false when the ack could not be sent (the broker then redelivers, and the copy is
    /// settled as already done).
    pub async fn ack(self) -> bool {
        match self.acker.ack(BasicAckOptions::default()).await {
            Ok(true) => true,
            Ok(false) => {
                warn!("ack was not sent (channel closed or delivery already settled); the broker will redeliver");
                false
            }
            Err(e) => {
                warn!(error = %e, "ack failed; the broker will redeliver and the job will be acked as already done");
                false
            }
        }
    }

    /// Nack with requeue: the fallback when no copy could be published (it counts toward the
    /// delivery limit on a quorum queue).
    async fn requeue(self) {
        if let Err(e) = self.acker.nack(BasicNackOptions { requeue: true, multiple: false }).await {
            debug!(error = %e, "nack failed; the broker requeues when the channel closes");
        }
    }

    /// A header of ours counting returns (0 when absent).
    fn count_header(&self, name: &str) -> i64 {
        match self.properties.headers().as_ref().and_then(|h| h.inner().get(name).cloned()) {
            Some(AMQPValue::LongLongInt(n)) => n,
            _ => 0,
        }
    }

    /// How often this message was given back after reaching the delivery limit unclaimed.
    pub fn unclaimed_returns(&self) -> u64 {
        u64::try_from(self.count_header(UNCLAIMED_RETURNS_HEADER)).unwrap_or(0)
    }

    /// A fresh copy's properties: our counters moved on (`RETURNED_HEADER`, and
    /// `UNCLAIMED_RETURNS_HEADER` when `unclaimed`), the broker's delivery headers dropped.
    fn returned_copy_properties(&self, unclaimed: bool) -> BasicProperties {
        let mut headers = self.properties.headers().clone().unwrap_or_default();
        headers.insert(RETURNED_HEADER.into(), AMQPValue::LongLongInt(self.count_header(RETURNED_HEADER) + 1));
        if unclaimed {
            headers.insert(UNCLAIMED_RETURNS_HEADER.into(), AMQPValue::LongLongInt(self.count_header(UNCLAIMED_RETURNS_HEADER) + 1));
        }
        strip_broker_headers(&mut headers);
        self.properties.clone().with_headers(headers)
    }
}

/// Headers the broker adds on delivery that must not travel with a fresh copy.
fn strip_broker_headers(headers: &mut FieldTable) {
    let keep: FieldTable = headers
        .inner()
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "x-delivery-count" | "x-death" | "x-first-death-exchange" | "x-first-death-queue" | "x-first-death-reason"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect::<std::collections::BTreeMap<_, _>>()
        .into();
    *headers = keep;
}

impl Drop for Delivery {
    fn drop(&mut self) {
        self.held.sub();
    }
}

/// Publishing on behalf of held messages: a channel in confirm mode, replaced on reconnect.
pub struct Outbox {
    amqp: AmqpConfig,
    channel: RwLock<Option<Channel>>,
}

impl Outbox {
    pub fn new(amqp: AmqpConfig) -> Outbox {
        Outbox { amqp, channel: RwLock::new(None) }
    }

    /// Installs the confirm-mode channel of a new connection.
    pub async fn set_channel(&self, channel: Channel) {
        *self.channel.write().await = Some(channel);
    }

    async fn channel(&self) -> Result<Channel, QueueError> {
        self.channel.read().await.clone().ok_or(QueueError::Timeout { op: "publish (no channel)" })
    }

    /// Returns messages to the queue without spending their delivery budget: a fresh copy each,
    /// confirmed, then the original acked. A message whose copy is not confirmed is nacked with
    /// requeue instead (the broker keeps it either way).
    pub async fn give_back(&self, deliveries: Vec<Delivery>) {
        self.give_back_counted(deliveries, false).await
    }

    /// The delivery limit of the job queue (`amqp.delivery_limit`).
    pub fn delivery_limit(&self) -> u64 {
        u64::from(self.amqp.delivery_limit)
    }

    /// [`Outbox::give_back`], counting each copy as an unclaimed return when `unclaimed`.
    async fn give_back_counted(&self, deliveries: Vec<Delivery>, unclaimed: bool) {
        if deliveries.is_empty() {
            return;
        }
        let channel = match self.channel().await {
            Ok(c) => c,
            Err(_) => {
                for d in deliveries {
                    d.requeue().await;
                }
                return;
            }
        };
        let mut pending = Vec::with_capacity(deliveries.len());
        for d in deliveries {
            let published = channel
                .basic_publish(
                    self.amqp.exchange.as_str().into(),
                    self.amqp.routing_key.as_str().into(),
                    BasicPublishOptions { mandatory: true, ..Default::default() },
                    &d.body,
                    d.returned_copy_properties(unclaimed),
                )
                .await;
            pending.push((d, published));
        }
        let mut copied = 0usize;
        for (d, published) in pending {
            let confirmed = match published {
                Ok(confirm) => match tokio::time::timeout(queue::CONFIRM_TIMEOUT, confirm).await {
                    Ok(Ok(c)) => c.is_ack() && c.take_message().is_none(),
                    _ => false,
                },
                Err(_) => false,
            };
            if confirmed {
                copied += 1;
                d.ack().await;
            } else {
                d.requeue().await;
            }
        }
        debug!(copied, "gave messages back to the queue");
    }

    /// Publishes the message to the dead-letter exchange with its code and reason, then acks
    /// it; gives it back when the dead letter cannot be published.
    pub async fn dead_letter(&self, d: Delivery, code: &str, reason: &str, job_id: Option<Uuid>) -> bool {
        let published = match self.channel().await {
            Ok(ch) => queue::dead_letter(&ch, &self.amqp, &d.body, code, reason, job_id).await,
            Err(e) => Err(e),
        };
        match published {
            Ok(()) => {
                d.ack().await;
                true
            }
            Err(e) => {
                warn!(error = %e, "could not dead-letter; giving the message back");
                self.give_back(vec![d]).await;
                false
            }
        }
    }
}

/// Ending a message with a reason: recorded in Postgres first, then dead-lettered.
pub struct Settler {
    pub db: Db,
    pub outbox: Arc<Outbox>,
    pub retry: Retry,
    pub worker_id: String,
    pub counters: Arc<Counters>,
}

impl Settler {
    /// A message that is not a valid job (or conflicts with a stored one): `rejections` row,
    /// dead letter, ack.
    pub async fn reject(&self, rejection: Rejection, d: Delivery) {
        let reason = crate::job::escape_controls(&rejection.to_string());
        warn!(job_id = ?rejection.job_id, code = rejection.kind.code(), %reason, "rejecting message");
        let recorded = self.retry.run("record rejection", || self.db.record_rejection(&rejection, d.body(), &self.worker_id)).await;
        if let Err(e) = recorded {
            warn!(error = %e, "rejection not recorded in postgres; giving the message back");
            self.outbox.give_back(vec![d]).await;
            return;
        }
        if self.outbox.dead_letter(d, rejection.kind.code(), &reason, rejection.job_id).await {
            self.counters.add_rejected(1);
        }
    }

    /// A job on its last delivery the broker allows (the ones before crashed workers or lost
    /// connections): dead-lettered here with the reason, so it never disappears silently into the
    /// dead-letter queue. A job already done is just acked. A job no worker ever claimed was only
    /// prefetched by the workers that were lost: it did not crash them, so it goes back with its
    /// count reset (at most `delivery_limit` times; then it fails like any other).
    pub async fn give_up(&self, job: &crate::job::Job, d: Delivery) {
        let job_id = job.job_id;
        let rejection = Rejection::of(job, RejectionKind::DeliveryLimit { deliveries: d.previous_deliveries() });
        let reason = rejection.to_string();
        match self.retry.run("read job status", || self.db.job_state(job_id)).await {
            Ok(Some((status, _))) if status == "done" => {
                d.ack().await;
                return;
            }
            Ok(state) if state.as_ref().is_none_or(|(_, claims)| *claims == 0) && d.unclaimed_returns() < self.outbox.delivery_limit() => {
                info!(%job_id, deliveries = d.previous_deliveries(), "never claimed: the lost deliveries were prefetched by workers that went away; given back with its count reset");
                return self.outbox.give_back_counted(vec![d], true).await;
            }
            Ok(_) => {}
            Err(_) => return self.outbox.give_back(vec![d]).await,
        }
        error!(%job_id, %reason, "giving up on a job");
        let ids = [job_id];
        let recorded = self
            .retry
            .run("record delivery limit", || async {
                self.db.record_rejection(&rejection, d.body(), &self.worker_id).await?;
                self.db.mark_failed(&ids, &reason).await
            })
            .await;
        if recorded.is_err() {
            return self.outbox.give_back(vec![d]).await;
        }
        self.counters.add_failed(1);
        self.outbox.dead_letter(d, rejection.kind.code(), &reason, Some(job_id)).await;
    }

    /// A job that failed on its own: `failed` row with the reason, dead letter, ack.
    pub async fn fail(&self, job_id: Uuid, reason: &str, d: Delivery) {
        error!(%job_id, %reason, "job failed");
        let ids = [job_id];
        if self.retry.run("mark failed", || self.db.mark_failed(&ids, reason)).await.is_err() {
            self.outbox.give_back(vec![d]).await;
            return;
        }
        self.counters.add_failed(1);
        self.outbox.dead_letter(d, "synthesis_failed", reason, Some(job_id)).await;
    }

    /// Gives messages back and releases their claims (best effort: a claim left behind expires).
    pub async fn give_back_claimed(&self, job_ids: &[Uuid], deliveries: Vec<Delivery>) {
        if !job_ids.is_empty() {
            if let Err(e) = self.db.release(job_ids, &self.worker_id).await {
                info!(error = %e, "claims not released; they expire on their own");
            }
        }
        self.outbox.give_back(deliveries).await;
    }
}
