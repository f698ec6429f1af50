//! `[amqp]`: the broker and the queue topology's names.

use std::time::Duration;

use serde::Deserialize;

use super::check::{name, positive, RawDuration};
use super::{ConfigError, SecretUrl};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAmqp {
    pub url: SecretUrl,
    #[serde(deserialize_with = "url_list")]
    pub urls: Vec<SecretUrl>,
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
    pub publish_give_up: RawDuration,
}

/// `urls` as a TOML array or one comma-separated string (how an environment variable sets it).
fn url_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<SecretUrl>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Urls {
        One(String),
        Many(Vec<String>),
    }
    let list = match Urls::deserialize(d)? {
        Urls::One(s) => s.split(',').map(str::to_string).collect(),
        Urls::Many(v) => v,
    };
    Ok(list.into_iter().map(|u| u.trim().to_string()).filter(|u| !u.is_empty()).map(SecretUrl::new).collect())
}

/// Broker connection and queue topology names.
#[derive(Debug, Clone)]
pub struct AmqpConfig {
    /// Every broker address, tried in order on each (re)connection: the nodes of a cluster. Never
    /// empty (validated).
    pub urls: Vec<SecretUrl>,
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
    /// A publisher (`enqueue`) that gets no confirm for this long — the broker down or its port
    /// closed — gives up with an error that says how many jobs were published.
    pub publish_give_up: Duration,
}

impl RawAmqp {
    pub fn validate(self) -> Result<AmqpConfig, ConfigError> {
        // `urls` wins; else `url`, which may itself list several (AMQP_URL=amqp://a,amqp://b).
        let urls: Vec<SecretUrl> = if self.urls.is_empty() {
            self.url.expose().split(',').map(str::trim).filter(|u| !u.is_empty()).map(SecretUrl::new).collect()
        } else {
            self.urls
        };
        let key = if urls.len() > 1 { "amqp.urls" } else { "amqp.url" };
        if urls.is_empty() {
            return Err(ConfigError::Invalid { key, reason: "no broker address".into() });
        }
        if let Some(bad) = urls.iter().find(|u| !(u.expose().starts_with("amqp://") || u.expose().starts_with("amqps://"))) {
            return Err(ConfigError::Invalid { key, reason: format!("{} must start with amqp:// or amqps://", bad.redacted()) });
        }
        let delivery_limit = positive("amqp.delivery_limit", self.delivery_limit)?;
        let prefetch = u16::try_from(self.prefetch)
            .map_err(|_| ConfigError::Invalid { key: "amqp.prefetch", reason: format!("must be 0..=65535, got {}", self.prefetch) })?;
        Ok(AmqpConfig {
            urls,
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
            publish_give_up: self.publish_give_up.positive("amqp.publish_give_up")?,
        })
    }
}

impl AmqpConfig {
    /// The first broker address (a single broker's, or a cluster's first node).
    pub fn url(&self) -> &SecretUrl {
        &self.urls[0]
    }

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

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use std::collections::BTreeMap;

    fn load(pairs: &[(&str, &str)]) -> Result<Config, crate::config::ConfigError> {
        Config::load(None, &pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>())
    }

    #[test]
    fn several_broker_addresses_come_from_urls_or_a_comma_separated_url_in_order() {
        let one = load(&[]).unwrap();
        assert_eq!(one.amqp.urls.len(), 1);
        let listed = load(&[("VOXBATCH_AMQP__URLS", "amqp://a:5672/%2f, amqp://b:5672/%2f,amqp://c/%2f")]).unwrap();
        let hosts: Vec<&str> = listed.amqp.urls.iter().map(|u| u.expose()).collect();
        assert_eq!(hosts, ["amqp://a:5672/%2f", "amqp://b:5672/%2f", "amqp://c/%2f"]);
        assert_eq!(listed.amqp.url().expose(), "amqp://a:5672/%2f");
        let from_amqp_url = load(&[("AMQP_URL", "amqp://x/%2f,amqps://y/%2f")]).unwrap();
        assert_eq!(from_amqp_url.amqp.urls.len(), 2);
        let err = load(&[("VOXBATCH_AMQP__URLS", "amqp://a/%2f,http://b")]).unwrap_err().to_string();
        assert!(err.contains("amqp.urls"), "{err}");
    }
}
