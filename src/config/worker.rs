//! `[worker]`: identity, heartbeats, retrying, the hold limit and the spool of finished audio.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::check::{non_negative, RawDuration};
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
    pub spool_dir: String,
    pub spool_max_bytes: i64,
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
    /// Where finished audio of batches given back is kept (`worker::spool`); `None`: the default,
    /// [`WorkerConfig::spool_dir`].
    pub spool_dir: Option<PathBuf>,
    /// The spool's size limit (oldest entries evicted first); 0: no spool.
    pub spool_max_bytes: u64,
}

impl WorkerConfig {
    /// The spool's directory: `spool_dir`, else `voxbatch-spool` in the system's temporary
    /// directory (`$TMPDIR`, else `/tmp`).
    pub fn spool_dir(&self) -> PathBuf {
        self.spool_dir.clone().unwrap_or_else(|| std::env::temp_dir().join("voxbatch-spool"))
    }
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
            spool_dir: Some(self.spool_dir.trim()).filter(|s| !s.is_empty()).map(PathBuf::from),
            spool_max_bytes: non_negative("worker.spool_max_bytes", self.spool_max_bytes)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn the_spool_defaults_to_two_gib_in_the_temporary_directory_and_refuses_a_negative_size() {
        let c = Config::defaults().unwrap();
        assert_eq!(c.worker.spool_max_bytes, 2 << 30);
        assert_eq!(c.worker.spool_dir(), std::env::temp_dir().join("voxbatch-spool"));
        let env = |k: &str, v: &str| std::collections::BTreeMap::from([(k.to_string(), v.to_string())]);
        let c = Config::load(None, &env("VOXBATCH_WORKER__SPOOL_DIR", "/var/spool/voxbatch")).unwrap();
        assert_eq!(c.worker.spool_dir(), std::path::PathBuf::from("/var/spool/voxbatch"));
        let e = Config::load(None, &env("VOXBATCH_WORKER__SPOOL_MAX_BYTES", "-1")).unwrap_err();
        assert!(e.to_string().contains("worker.spool_max_bytes"), "{e}");
    }
}
