//! `[worker]`: identity, heartbeats, retrying and the hold limit.

use std::time::Duration;

use serde::Deserialize;

use super::check::RawDuration;
use super::ConfigError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWorker {
    pub id: String,
    pub heartbeat: RawDuration,
    pub retry_min: RawDuration,
    pub retry_max: RawDuration,
    pub max_hold: RawDuration,
    pub drain_poll: RawDuration,
    pub events_sweep: RawDuration,
}

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub id: Option<String>,
    pub heartbeat: Duration,
    pub retry_min: Duration,
    pub retry_max: Duration,
    pub max_hold: Duration,
    pub drain_poll: Duration,
    /// How often unpublished completion events are swept up and published.
    pub events_sweep: Duration,
}

/// Three stages of `max_hold` must stay inside RabbitMQ's 30-minute consumer timeout.
const MAX_HOLD_LIMIT: Duration = Duration::from_secs(600);

impl RawWorker {
    pub fn validate(self) -> Result<WorkerConfig, ConfigError> {
        let max_hold = self.max_hold.positive("worker.max_hold")?;
        if max_hold > MAX_HOLD_LIMIT {
            return Err(ConfigError::Invalid {
                key: "worker.max_hold",
                reason: "must be at most 10m: three stages of it must stay inside RabbitMQ's 30-minute consumer timeout".into(),
            });
        }
        Ok(WorkerConfig {
            id: Some(self.id).filter(|s| !s.is_empty()),
            heartbeat: self.heartbeat.positive("worker.heartbeat")?,
            retry_min: self.retry_min.positive("worker.retry_min")?,
            retry_max: self.retry_max.positive("worker.retry_max")?,
            max_hold,
            drain_poll: self.drain_poll.positive("worker.drain_poll")?,
            events_sweep: self.events_sweep.positive("worker.events_sweep")?,
        })
    }
}
