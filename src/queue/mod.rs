//! RabbitMQ: the queue topology, publishing jobs with publisher confirms, dead-lettering with a
//! reason, and queue depths.
//!
//! Topology (declared idempotently by `migrate`, `enqueue` and `work`): durable direct exchange
//! `voxbatch` → quorum queue `voxbatch.jobs` (routing key `jobs`, `x-delivery-limit`,
//! dead-letter exchange `voxbatch.dlx`) and direct exchange `voxbatch.dlx` → quorum queue
//! `voxbatch.jobs.dead` (same routing key). Names come from [`AmqpConfig`].
//!
//! Neighbours: `job` defines the message body; `worker::intake` consumes from the queue this
//! module declares; `worker::delivery` calls [`dead_letter`] and publishes returned copies;
//! [`dead`] walks the dead-letter queue for the `voxbatch dead` commands.

pub mod dead;

use std::time::Duration;

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use uuid::Uuid;

use crate::config::AmqpConfig;
use crate::job::Job;

/// Errors of the queue stage.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    #[error("cannot connect to RabbitMQ at {url}")]
    Connect { url: String, source: lapin::Error },
    #[error("RabbitMQ {op} failed")]
    Amqp { op: &'static str, source: lapin::Error },
    #[error(
        "queue {queue} exists with different arguments (it must be a quorum queue with x-delivery-limit and \
         dead-letter exchange as configured); delete it or change amqp.queue"
    )]
    TopologyMismatch { queue: String, source: lapin::Error },
    #[error("RabbitMQ {op} timed out")]
    Timeout { op: &'static str },
    #[error("the broker did not confirm publishing job {job_id} (nack or returned as unroutable)")]
    NotConfirmed { job_id: Uuid },
}

/// How long one broker address may take to accept a connection before the next is tried.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a publisher waits for one confirm.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

impl crate::transience::Transience for QueueError {
    /// The broker refused the credentials or the access (ACCESS_REFUSED, NOT_ALLOWED): waiting
    /// does not help.
    fn is_permanent(&self) -> bool {
        use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
        let source = match self {
            QueueError::Connect { source, .. } | QueueError::Amqp { source, .. } => source,
            _ => return false,
        };
        match source.kind() {
            lapin::ErrorKind::ProtocolError(e) => matches!(
                e.kind(),
                AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED) | AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED)
            ),
            lapin::ErrorKind::AuthProviderError(_) => true,
            _ => false,
        }
    }
}

fn amqp(op: &'static str) -> impl FnOnce(lapin::Error) -> QueueError {
    move |source| QueueError::Amqp { op, source }
}

/// Opens a connection named `name` (shown in the management UI) to the first of `amqp.urls` that
/// answers within [`CONNECT_TIMEOUT`], in order; the error is the last address's (callers retry
/// with back-off). A refusal of the credentials is returned at once: every node of a cluster
/// shares its users.
pub async fn connect(cfg: &AmqpConfig, name: &str) -> Result<Connection, QueueError> {
    use crate::transience::Transience;
    let mut last = None;
    for (i, url) in cfg.urls.iter().enumerate() {
        let props = ConnectionProperties::default().with_connection_name(name.into());
        let attempt = match tokio::time::timeout(CONNECT_TIMEOUT, Connection::connect(url.expose(), props)).await {
            Ok(result) => result.map_err(|source| QueueError::Connect { url: url.redacted(), source }),
            // A node whose host is gone may drop the SYN: do not wait for TCP to give up.
            Err(_) => Err(QueueError::Timeout { op: "connect" }),
        };
        match attempt {
            Ok(conn) => {
                if i > 0 {
                    tracing::info!(broker = %url.redacted(), "connected to a later broker address");
                }
                return Ok(conn);
            }
            Err(e) => {
                if e.is_permanent() {
                    return Err(e);
                }
                if i + 1 < cfg.urls.len() {
                    tracing::warn!(broker = %url.redacted(), error = %e, "broker unreachable; trying the next address");
                }
                last = Some(e);
            }
        }
    }
    Err(last.unwrap_or(QueueError::Timeout { op: "connect (no broker address)" }))
}

/// Declares the exchanges, queues and bindings (idempotent). Uses (and may close, on a
/// mismatch) `channel`.
pub async fn declare_topology(channel: &Channel, cfg: &AmqpConfig) -> Result<(), QueueError> {
    let durable = ExchangeDeclareOptions { durable: true, ..Default::default() };
    channel
        .exchange_declare(cfg.events_exchange.as_str().into(), ExchangeKind::Topic, durable, FieldTable::default())
        .await
        .map_err(amqp("exchange.declare"))?;
    for exchange in [&cfg.exchange, &cfg.dead_letter_exchange] {
        channel
            .exchange_declare(exchange.as_str().into(), ExchangeKind::Direct, durable, FieldTable::default())
            .await
            .map_err(amqp("exchange.declare"))?;
    }
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
    args.insert("x-delivery-limit".into(), AMQPValue::LongLongInt(i64::from(cfg.delivery_limit)));
    args.insert("x-dead-letter-exchange".into(), AMQPValue::LongString(cfg.dead_letter_exchange.as_str().into()));
    let qopts = QueueDeclareOptions { durable: true, ..Default::default() };
    channel
        .queue_declare(cfg.queue.as_str().into(), qopts, args)
        .await
        .map_err(|source| QueueError::TopologyMismatch { queue: cfg.queue.clone(), source })?;
    let mut dargs = FieldTable::default();
    dargs.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
    channel
        .queue_declare(cfg.dead_letter_queue.as_str().into(), qopts, dargs)
        .await
        .map_err(|source| QueueError::TopologyMismatch { queue: cfg.dead_letter_queue.clone(), source })?;
    for (queue, exchange) in [(&cfg.queue, &cfg.exchange), (&cfg.dead_letter_queue, &cfg.dead_letter_exchange)] {
        channel
            .queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                cfg.routing_key.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(amqp("queue.bind"))?;
    }
    Ok(())
}

/// Deletes the queues and exchanges of a topology (tests clean up with this).
pub async fn delete_topology(channel: &Channel, cfg: &AmqpConfig) -> Result<(), QueueError> {
    for queue in [&cfg.queue, &cfg.dead_letter_queue] {
        channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await.map_err(amqp("queue.delete"))?;
    }
    for exchange in [&cfg.exchange, &cfg.dead_letter_exchange, &cfg.events_exchange] {
        channel
            .exchange_delete(exchange.as_str().into(), Default::default())
            .await
            .map_err(amqp("exchange.delete"))?;
    }
    Ok(())
}

/// Ready messages in the job queue and in the dead-letter queue.
pub async fn queue_depths(channel: &Channel, cfg: &AmqpConfig) -> Result<(u32, u32), QueueError> {
    let passive = QueueDeclareOptions { passive: true, ..Default::default() };
    let jobs = channel
        .queue_declare(cfg.queue.as_str().into(), passive, FieldTable::default())
        .await
        .map_err(amqp("queue.declare passive"))?;
    let dead = channel
        .queue_declare(cfg.dead_letter_queue.as_str().into(), passive, FieldTable::default())
        .await
        .map_err(amqp("queue.declare passive"))?;
    Ok((jobs.message_count(), dead.message_count()))
}

fn job_properties(job_id: Option<Uuid>) -> BasicProperties {
    let props = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
        .with_timestamp(chrono::Utc::now().timestamp().max(0) as u64);
    match job_id {
        Some(id) => props.with_message_id(id.to_string().as_str().into()),
        None => props,
    }
}

/// Publishes jobs with publisher confirms: every job is confirmed by the broker (persisted and
/// routed to the queue) before [`Publisher::publish`] returns, or it is an error.
pub struct Publisher {
    channel: Channel,
    exchange: ShortString,
    routing_key: ShortString,
}

/// Confirms awaited together (throughput without an unbounded number in flight).
const CONFIRM_WINDOW: usize = 256;

impl Publisher {
    pub async fn new(conn: &Connection, cfg: &AmqpConfig) -> Result<Publisher, QueueError> {
        let channel = conn.create_channel().await.map_err(amqp("channel.open"))?;
        declare_topology(&channel, cfg).await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await.map_err(amqp("confirm.select"))?;
        Ok(Publisher { channel, exchange: cfg.exchange.as_str().into(), routing_key: cfg.routing_key.as_str().into() })
    }

    /// Publishes `jobs` and waits for every confirm; `progress` is called with the number
    /// confirmed so far. On error, jobs before the failing window are confirmed, the rest may or
    /// may not be (publish again: job ids make it idempotent).
    pub async fn publish(&self, jobs: &[Job], progress: impl FnMut(usize)) -> Result<(), QueueError> {
        let never = std::future::pending::<()>();
        tokio::pin!(never);
        self.publish_until(jobs, &mut false, &mut never, progress).await
    }

    /// [`Publisher::publish`] that stops between confirm windows once `shutdown` has resolved
    /// (setting `stop`): the windows in flight are confirmed first.
    pub async fn publish_until<F: std::future::Future<Output = ()>>(
        &self,
        jobs: &[Job],
        stop: &mut bool,
        shutdown: &mut std::pin::Pin<&mut F>,
        mut progress: impl FnMut(usize),
    ) -> Result<(), QueueError> {
        use futures::FutureExt;
        let mut done = 0;
        for window in jobs.chunks(CONFIRM_WINDOW) {
            if *stop || shutdown.as_mut().now_or_never().is_some() {
                *stop = true;
                return Ok(());
            }
            let mut confirms = Vec::with_capacity(window.len());
            for job in window {
                let confirm = self
                    .channel
                    .basic_publish(
                        self.exchange.clone(),
                        self.routing_key.clone(),
                        BasicPublishOptions { mandatory: true, ..Default::default() },
                        &job.to_json(),
                        job_properties(Some(job.job_id)),
                    )
                    .await
                    .map_err(amqp("basic.publish"))?;
                confirms.push((job.job_id, confirm));
            }
            for (job_id, confirm) in confirms {
                let confirmation = confirm.await.map_err(amqp("publisher confirm"))?;
                // A mandatory message that could not be routed comes back acked *with* the message.
                if !confirmation.is_ack() || confirmation.take_message().is_some() {
                    return Err(QueueError::NotConfirmed { job_id });
                }
            }
            done += window.len();
            progress(done);
        }
        Ok(())
    }

    /// Publishes one raw body (tests and other clients' formats); confirmed like [`Publisher::publish`].
    pub async fn publish_raw(&self, body: &[u8]) -> Result<(), QueueError> {
        let confirmation = self
            .channel
            .basic_publish(
                self.exchange.clone(),
                self.routing_key.clone(),
                BasicPublishOptions { mandatory: true, ..Default::default() },
                body,
                job_properties(None),
            )
            .await
            .map_err(amqp("basic.publish"))?
            .await
            .map_err(amqp("publisher confirm"))?;
        if !confirmation.is_ack() || confirmation.take_message().is_some() {
            return Err(QueueError::NotConfirmed { job_id: Uuid::nil() });
        }
        Ok(())
    }
}

/// Header carrying the reason a worker dead-lettered a message.
pub const REASON_HEADER: &str = "x-voxbatch-reason";
/// Header carrying the machine-readable rejection code.
pub const CODE_HEADER: &str = "x-voxbatch-code";

/// Publishes `body` to the dead-letter exchange with the reason in headers and waits for the
/// confirm. The caller acks the original afterwards: at-least-once into the dead-letter queue
/// (plain broker dead-lettering would be at-most-once). `channel` must be in confirm mode.
pub async fn dead_letter(
    channel: &Channel,
    cfg: &AmqpConfig,
    body: &[u8],
    code: &str,
    reason: &str,
    job_id: Option<Uuid>,
) -> Result<(), QueueError> {
    let mut headers = FieldTable::default();
    headers.insert(REASON_HEADER.into(), AMQPValue::LongString(LongString::from(reason)));
    headers.insert(CODE_HEADER.into(), AMQPValue::LongString(LongString::from(code)));
    headers.insert(dead::DEAD_AT_HEADER.into(), AMQPValue::LongString(chrono::Utc::now().to_rfc3339().as_str().into()));
    let props = job_properties(job_id).with_headers(headers);
    publish_confirmed(channel, &cfg.dead_letter_exchange, &cfg.routing_key, true, body, props, "dead-letter", job_id).await
}

/// Publishes one message and waits (at most [`CONFIRM_TIMEOUT`]) for the broker's confirm: the
/// one confirmed-publish path for single messages (dead letters, requeues, events). `mandatory`:
/// an unroutable message is an error (job queues) rather than dropped (events with no listener).
/// `channel` must be in confirm mode.
#[allow(clippy::too_many_arguments)]
pub async fn publish_confirmed(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    mandatory: bool,
    body: &[u8],
    props: BasicProperties,
    what: &'static str,
    job_id: Option<Uuid>,
) -> Result<(), QueueError> {
    let confirmation = tokio::time::timeout(CONFIRM_TIMEOUT, async {
        channel
            .basic_publish(exchange.into(), routing_key.into(), BasicPublishOptions { mandatory, ..Default::default() }, body, props)
            .await?
            .await
    })
    .await
    .map_err(|_| QueueError::Timeout { op: what })?
    .map_err(amqp(what))?;
    if !confirmation.is_ack() || confirmation.take_message().is_some() {
        return Err(QueueError::NotConfirmed { job_id: job_id.unwrap_or_else(Uuid::nil) });
    }
    Ok(())
}

/// The reason header of a dead-lettered delivery, if a worker set one.
pub fn reason_of(props: &BasicProperties) -> Option<String> {
    dead::header_str(props, REASON_HEADER)
}
