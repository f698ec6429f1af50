//! `[amqp]`: the broker and the queue topology's names.

use std::time::Duration;

use serde::Deserialize;

use super::check::{name, positive, RawDuration};
use super::{ConfigError, SecretUrl};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAmqp {
    pub url: SecretUrl,
    pub exchange: String,
    pub routing_key: String,
    pub queue: String,
    pub dead_letter_exchange: String,
    pub dead_letter_queue: String,
    pub events_exchange: String,
    pub delivery_limit: i64,
    pub prefetch: i64,
    pub reconnect_min: RawDuration,
    pub reconnect_max: RawDuration,
}

/// Broker connection and queue topology names.
#[derive(Debug, Clone)]
pub struct AmqpConfig {
    pub url: SecretUrl,
    pub exchange: String,
    pub routing_key: String,
    pub queue: String,
    pub dead_letter_exchange: String,
    pub dead_letter_queue: String,
    /// Durable topic exchange completion events are published to.
    pub events_exchange: String,
    pub delivery_limit: u32,
    /// 0 = derived from the batch size.
    pub prefetch: u16,
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
}

impl RawAmqp {
    pub fn validate(self) -> Result<AmqpConfig, ConfigError> {
        let scheme_ok = self.url.expose().starts_with("amqp://") || self.url.expose().starts_with("amqps://");
        if !scheme_ok {
            return Err(ConfigError::Invalid { key: "amqp.url", reason: "must start with amqp:// or amqps://".into() });
        }
        let delivery_limit = positive("amqp.delivery_limit", self.delivery_limit)?;
        let prefetch = u16::try_from(self.prefetch)
            .map_err(|_| ConfigError::Invalid { key: "amqp.prefetch", reason: format!("must be 0..=65535, got {}", self.prefetch) })?;
        Ok(AmqpConfig {
            url: self.url,
            exchange: name("amqp.exchange", self.exchange)?,
            routing_key: name("amqp.routing_key", self.routing_key)?,
            queue: name("amqp.queue", self.queue)?,
            dead_letter_exchange: name("amqp.dead_letter_exchange", self.dead_letter_exchange)?,
            dead_letter_queue: name("amqp.dead_letter_queue", self.dead_letter_queue)?,
            events_exchange: name("amqp.events_exchange", self.events_exchange)?,
            delivery_limit: u32::try_from(delivery_limit).unwrap_or(u32::MAX),
            prefetch,
            reconnect_min: self.reconnect_min.positive("amqp.reconnect_min")?,
            reconnect_max: self.reconnect_max.positive("amqp.reconnect_max")?,
        })
    }
}

impl AmqpConfig {
    /// Per-consumer prefetch: the configured value, or three batches (one being recorded, one
    /// being inferred, one filling).
    pub fn effective_prefetch(&self, max_batch: usize) -> u16 {
        if self.prefetch > 0 {
            self.prefetch
        } else {
            u16::try_from(max_batch.saturating_mul(3).max(2)).unwrap_or(u16::MAX)
        }
    }
}
