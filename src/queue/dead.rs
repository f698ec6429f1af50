//! The dead-letter queue as operators see it: browse its messages without consuming them for
//! good, republish chosen ones to the job queue, or remove them.
//!
//! Browsing takes messages with `basic.get` (manual ack) and never acks the ones it only looks
//! at: they stay unacknowledged on this channel while the walk goes on (so each is seen once) and
//! return to the queue when [`DeadLetters::give_back`] nacks them or the channel closes — a crash
//! of the command loses nothing.
//!
//! Republishing is publish-with-confirm, then ack of the dead copy: interrupted between the two,
//! the message is in both queues; `commands::dead` records each requeue in Postgres so that a
//! second run acks such a copy instead of publishing it again, and the worker's claim makes any
//! copy of a job already done an ack without synthesis.
//!
//! Neighbours: `queue` (topology, headers written by [`super::dead_letter`]), `commands::dead`
//! (the `voxbatch dead` commands), `db` (the requeue record).

use lapin::options::{BasicAckOptions, BasicGetOptions, BasicNackOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection};
use uuid::Uuid;

use super::{amqp, QueueError, CODE_HEADER, REASON_HEADER};
use crate::config::AmqpConfig;

/// Header a worker stamps on a dead-lettered message: when.
pub const DEAD_AT_HEADER: &str = "x-voxbatch-dead-lettered-at";
/// Header `dead requeue` stamps on the republished copy: the code it was dead-lettered with.
pub const REQUEUED_FROM_HEADER: &str = "x-voxbatch-requeued-from";

/// How long [`DeadLetters::give_back`] waits for the queue to count the returned messages.
const GIVE_BACK_SETTLE: std::time::Duration = std::time::Duration::from_secs(5);

/// One message of the dead-letter queue, held (unacknowledged) by the browsing channel.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub delivery_tag: u64,
    pub job_id: Option<Uuid>,
    pub campaign: Option<String>,
    /// Rejection code (`x-voxbatch-code`), or `broker` for a message the broker dead-lettered
    /// itself (delivery limit reached) without a worker's reason.
    pub code: String,
    pub reason: String,
    /// When it was dead-lettered (RFC 3339), if a worker said.
    pub dead_lettered_at: Option<String>,
    pub body: Vec<u8>,
    pub properties: BasicProperties,
}

impl DeadLetter {
    /// The identity of this dead-lettering — job id, when, and a digest of the body — so a job
    /// dead-lettered again after a requeue is a new one, and two copies of one are the same.
    pub fn identity(&self) -> String {
        use sha2::{Digest, Sha256};
        let digest = hex::encode(Sha256::digest(&self.body));
        format!(
            "{}@{}#{}",
            self.job_id.map(|j| j.to_string()).unwrap_or_else(|| "-".into()),
            self.dead_lettered_at.as_deref().unwrap_or("-"),
            &digest[..16]
        )
    }
}

/// A walk over the dead-letter queue on a channel of its own (confirm mode, for republishing).
pub struct DeadLetters {
    channel: Channel,
    cfg: AmqpConfig,
    /// Messages taken and neither acked nor given back.
    held: std::collections::BTreeSet<u64>,
}

impl DeadLetters {
    pub async fn open(conn: &Connection, cfg: &AmqpConfig) -> Result<DeadLetters, QueueError> {
        let channel = conn.create_channel().await.map_err(amqp("channel.open"))?;
        super::declare_topology(&channel, cfg).await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await.map_err(amqp("confirm.select"))?;
        Ok(DeadLetters { channel, cfg: cfg.clone(), held: Default::default() })
    }

    /// The next message not yet seen by this walk, or `None` when the queue has no more.
    pub async fn next(&mut self) -> Result<Option<DeadLetter>, QueueError> {
        let got = self
            .channel
            .basic_get(self.cfg.dead_letter_queue.as_str().into(), BasicGetOptions { no_ack: false })
            .await
            .map_err(amqp("basic.get"))?;
        let Some(message) = got else { return Ok(None) };
        let d = message.delivery;
        self.held.insert(d.delivery_tag);
        let header = |name: &str| header_str(&d.properties, name);
        let parsed: Option<serde_json::Value> = serde_json::from_slice(&d.data).ok();
        let body_field = |k: &str| parsed.as_ref().and_then(|v| v.get(k)).and_then(|v| v.as_str()).map(str::to_string);
        let job_id = d
            .properties
            .message_id()
            .as_ref()
            .and_then(|m| Uuid::parse_str(m.as_str()).ok())
            .or_else(|| body_field("job_id").and_then(|s| Uuid::parse_str(&s).ok()));
        Ok(Some(DeadLetter {
            delivery_tag: d.delivery_tag,
            job_id,
            campaign: body_field("campaign"),
            code: header(CODE_HEADER).unwrap_or_else(|| "broker".into()),
            reason: header(REASON_HEADER).unwrap_or_else(|| "dead-lettered by the broker (delivery limit)".into()),
            dead_lettered_at: header(DEAD_AT_HEADER).or_else(|| broker_death_time(&d.properties)),
            body: d.data,
            properties: d.properties,
        }))
    }

    /// Publishes `letter`'s body to the job exchange (same message id and content type, the
    /// code it was dead-lettered with in a header) and waits for the broker's confirm.
    pub async fn republish(&self, letter: &DeadLetter) -> Result<(), QueueError> {
        let mut headers = FieldTable::default();
        headers.insert(REQUEUED_FROM_HEADER.into(), AMQPValue::LongString(LongString::from(letter.code.as_str())));
        let mut props = BasicProperties::default().with_delivery_mode(2).with_headers(headers);
        if let Some(id) = letter.properties.message_id() {
            props = props.with_message_id(id.clone());
        }
        if let Some(ct) = letter.properties.content_type() {
            props = props.with_content_type(ct.clone());
        }
        super::publish_confirmed(&self.channel, &self.cfg.exchange, &self.cfg.routing_key, true, &letter.body, props, "requeue", letter.job_id).await
    }

    /// Removes `letter` from the dead-letter queue for good.
    pub async fn ack(&mut self, letter: &DeadLetter) -> Result<(), QueueError> {
        self.channel.basic_ack(letter.delivery_tag, BasicAckOptions::default()).await.map_err(amqp("basic.ack"))?;
        self.held.remove(&letter.delivery_tag);
        Ok(())
    }

    /// Returns every message this walk holds to the queue and closes the channel.
    ///
    /// A quorum queue takes nacked messages back through its log, a moment after the nack: this
    /// waits (up to [`GIVE_BACK_SETTLE`]) until the queue counts at least as many ready messages as
    /// were given back, so a command run right after this one sees them all.
    pub async fn give_back(self) -> Result<(), QueueError> {
        if let Some(&last) = self.held.last() {
            // `multiple` nacks every unacknowledged tag up to `last` on this channel: exactly the held ones.
            self.channel
                .basic_nack(last, BasicNackOptions { multiple: true, requeue: true })
                .await
                .map_err(amqp("basic.nack"))?;
            let given_back = self.held.len() as u32;
            let deadline = std::time::Instant::now() + GIVE_BACK_SETTLE;
            loop {
                let (_, ready) = super::queue_depths(&self.channel, &self.cfg).await?;
                if ready >= given_back || std::time::Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
        let _ = self.channel.close(200, "done".into()).await;
        Ok(())
    }
}

/// When the broker dead-lettered a message itself (its `x-death` header's latest `time`), as
/// seconds since the epoch.
fn broker_death_time(props: &BasicProperties) -> Option<String> {
    let headers = props.headers().as_ref()?;
    let AMQPValue::FieldArray(deaths) = headers.inner().get("x-death")? else { return None };
    deaths.as_slice().iter().find_map(|d| match d {
        AMQPValue::FieldTable(t) => match t.inner().get("time") {
            Some(AMQPValue::Timestamp(ts)) => Some(format!("broker:{ts}")),
            _ => None,
        },
        _ => None,
    })
}

/// A string header of `props`, if present.
pub fn header_str(props: &BasicProperties, name: &str) -> Option<String> {
    let headers = props.headers().as_ref()?;
    match headers.inner().get(name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).to_string()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
    }
}
