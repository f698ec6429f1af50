//! Configuration: one typed [`Config`], read in two stages.
//!
//! 1. Layers of TOML are merged into one table: the built-in `config/default.toml`, then the
//!    user's file, then environment overrides (`VOXBATCH_SECTION__KEY` and the usual `AMQP_URL`,
//!    `DATABASE_URL`, `S3_ENDPOINT`, `AWS_*`). The environment is passed in as a map, never read
//!    from globals here, so this module is testable.
//! 2. The merged table is deserialised into [`RawConfig`] (`deny_unknown_fields`: a typo is an
//!    error, not a silently ignored key) and [`RawConfig::validate`] turns it into [`Config`].
//!
//! Neighbours: `main.rs` applies CLI flags on top; every other module takes its section.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::model::{Device, Precision};

/// The defaults, built into the binary so that it runs with no file around.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// Errors reading or validating configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path} is not valid TOML")]
    Parse { path: PathBuf, source: toml::de::Error },
    #[error("invalid configuration")]
    Shape(#[source] toml::de::Error),
    #[error("environment variable {var} names unknown config section `{section}`")]
    UnknownEnvSection { var: String, section: String },
    #[error("invalid value for `{key}`: {reason}")]
    Invalid { key: &'static str, reason: String },
}

/// A secret string (password, key): never printed by `Debug` or `Display`.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "\"***\"" })
    }
}

/// A URL whose password, if any, is never printed.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct SecretUrl(String);

impl SecretUrl {
    pub fn new(s: impl Into<String>) -> Self {
        SecretUrl(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
    /// The URL with its password replaced by `***`, for logs and errors.
    pub fn redacted(&self) -> String {
        match url::Url::parse(&self.0) {
            Ok(mut u) => {
                if u.password().is_some() {
                    let _ = u.set_password(Some("***"));
                }
                u.to_string()
            }
            Err(_) => "<unparseable url>".to_string(),
        }
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// The file as written: serde shapes only, checked by [`RawConfig::validate`].
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub amqp: RawAmqp,
    pub database: RawDatabase,
    pub storage: RawStorage,
    pub model: RawModel,
    pub batching: RawBatching,
    pub limits: RawLimits,
    pub worker: RawWorker,
    pub memory: RawMemory,
    pub cost: RawCost,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCost {
    pub gpu_hourly_usd: BTreeMap<String, f64>,
    pub cpu_hourly_usd: f64,
    pub default_gpu_hourly_usd: f64,
    pub energy_usd_per_kwh: f64,
    pub sample_interval_ms: i64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAmqp {
    pub url: SecretUrl,
    pub exchange: String,
    pub routing_key: String,
    pub queue: String,
    pub dead_letter_exchange: String,
    pub dead_letter_queue: String,
    pub delivery_limit: i64,
    pub prefetch: i64,
    pub reconnect_min_secs: f64,
    pub reconnect_max_secs: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDatabase {
    pub url: SecretUrl,
    pub max_connections: i64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStorage {
    pub url: String,
    pub key_prefix: String,
    pub endpoint: String,
    pub region: String,
    pub force_path_style: bool,
    pub access_key_id: String,
    pub secret_access_key: Secret,
    pub create_bucket: bool,
    pub upload_concurrency: i64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    pub dir: PathBuf,
    pub device: String,
    pub precision: String,
    pub cpu_threads: i64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBatching {
    pub max_batch: i64,
    pub max_wait_ms: i64,
    pub max_batch_tokens: i64,
    pub max_length_ratio: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    pub max_text_chars: i64,
    pub max_message_bytes: i64,
    pub max_speech_tokens: i64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMemory {
    pub policy: String,
    pub vram_fraction: f64,
    pub budget_bytes: i64,
    pub safety_margin_bytes: i64,
    pub safety_initial: f64,
    pub oom_backoff: f64,
    pub recover_step: f64,
    pub recover_after: i64,
    pub calibration_dir: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWorker {
    pub id: String,
    pub heartbeat_secs: f64,
    pub retry_min_secs: f64,
    pub retry_max_secs: f64,
    pub max_hold_secs: f64,
    pub drain_poll_ms: i64,
}

/// Validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub amqp: AmqpConfig,
    pub database: DatabaseConfig,
    pub storage: StorageConfig,
    pub model: ModelConfig,
    pub batching: BatchingConfig,
    pub limits: Limits,
    pub worker: WorkerConfig,
    pub memory: MemoryConfig,
    pub cost: CostConfig,
}

/// Prices and metric sampling.
#[derive(Debug, Clone)]
pub struct CostConfig {
    pub prices: crate::cost::Prices,
    pub sample_interval: Duration,
}

/// How batches are sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizingPolicy {
    /// Predicted peak memory under a budget.
    Memory,
    /// Padded tokens only.
    Tokens,
}

/// The memory-aware batch policy's settings.
#[derive(Debug, Clone)]
pub struct MemoryConfig {
    pub policy: SizingPolicy,
    pub vram_fraction: f64,
    /// Fixed budget instead of the fraction.
    pub budget_bytes: Option<u64>,
    pub safety_margin_bytes: u64,
    pub aimd: crate::batch::memory::Aimd,
    pub calibration_dir: PathBuf,
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
    pub delivery_limit: u32,
    /// 0 = derived from the batch size.
    pub prefetch: u16,
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
}

#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    pub url: SecretUrl,
    pub max_connections: u32,
}

/// Where audio objects go.
#[derive(Debug, Clone)]
pub enum StorageTarget {
    S3 { bucket: String },
    File { root: PathBuf },
}

#[derive(Debug, Clone)]
pub struct StorageConfig {
    pub target: StorageTarget,
    pub key_prefix: String,
    pub endpoint: Option<String>,
    pub region: String,
    pub force_path_style: bool,
    pub access_key_id: String,
    pub secret_access_key: Secret,
    pub create_bucket: bool,
    pub upload_concurrency: usize,
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub dir: PathBuf,
    pub device: Device,
    pub precision: Precision,
    pub cpu_threads: usize,
}

#[derive(Debug, Clone)]
pub struct BatchingConfig {
    pub max_batch: usize,
    pub max_wait: Duration,
    pub max_batch_tokens: usize,
    pub max_length_ratio: f64,
}

/// Limits on accepted input.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_text_chars: usize,
    pub max_message_bytes: usize,
    pub max_speech_tokens: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_text_chars: 20_000, max_message_bytes: 262_144, max_speech_tokens: 7_000 }
    }
}

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub id: Option<String>,
    pub heartbeat: Duration,
    pub retry_min: Duration,
    pub retry_max: Duration,
    pub max_hold: Duration,
    pub drain_poll: Duration,
}

/// Standard environment variables and the config key each one sets.
const STANDARD_ENV: &[(&str, &str, &str)] = &[
    ("AMQP_URL", "amqp", "url"),
    ("DATABASE_URL", "database", "url"),
    ("S3_ENDPOINT", "storage", "endpoint"),
    ("AWS_ENDPOINT_URL", "storage", "endpoint"),
    ("AWS_ACCESS_KEY_ID", "storage", "access_key_id"),
    ("AWS_SECRET_ACCESS_KEY", "storage", "secret_access_key"),
    ("AWS_REGION", "storage", "region"),
];

impl Config {
    /// Loads the defaults, `file` (if any) and `env` overrides, then validates.
    pub fn load(file: Option<&Path>, env: &BTreeMap<String, String>) -> Result<Config, ConfigError> {
        let mut table: toml::Table = DEFAULT_TOML.parse().map_err(|source| ConfigError::Parse {
            path: PathBuf::from("<built-in config/default.toml>"),
            source,
        })?;
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
            let user: toml::Table =
                text.parse().map_err(|source| ConfigError::Parse { path: path.to_path_buf(), source })?;
            merge(&mut table, user);
        }
        apply_env(&mut table, env)?;
        let raw: RawConfig = toml::Value::Table(table).try_into().map_err(ConfigError::Shape)?;
        raw.validate()
    }

    /// The defaults alone (tests start from this and change fields).
    pub fn defaults() -> Result<Config, ConfigError> {
        Config::load(None, &BTreeMap::new())
    }
}

fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// Parses an environment value as a TOML scalar when it is one (numbers, booleans), else a string.
fn env_value(raw: &str, current: Option<&toml::Value>) -> toml::Value {
    match current {
        Some(toml::Value::String(_)) | None => toml::Value::String(raw.to_string()),
        Some(_) => {
            let parsed: Result<toml::Table, _> = format!("v = {raw}").parse();
            match parsed.ok().and_then(|mut t| t.remove("v")) {
                Some(v) => v,
                None => toml::Value::String(raw.to_string()),
            }
        }
    }
}

fn apply_env(table: &mut toml::Table, env: &BTreeMap<String, String>) -> Result<(), ConfigError> {
    for (var, value) in env {
        let Some(path) = var.strip_prefix("VOXBATCH_") else { continue };
        let Some((section, key)) = path.split_once("__") else { continue };
        let (section, key) = (section.to_ascii_lowercase(), key.to_ascii_lowercase());
        let Some(toml::Value::Table(sec)) = table.get_mut(&section) else {
            return Err(ConfigError::UnknownEnvSection { var: var.clone(), section });
        };
        let v = env_value(value, sec.get(&key));
        sec.insert(key, v);
    }
    for (var, section, key) in STANDARD_ENV {
        if let Some(value) = env.get(*var).filter(|v| !v.is_empty()) {
            if let Some(toml::Value::Table(sec)) = table.get_mut(*section) {
                sec.insert((*key).to_string(), toml::Value::String(value.clone()));
            }
        }
    }
    Ok(())
}

fn positive(key: &'static str, v: i64) -> Result<usize, ConfigError> {
    if v <= 0 {
        return Err(ConfigError::Invalid { key, reason: format!("must be > 0, got {v}") });
    }
    usize::try_from(v).map_err(|_| ConfigError::Invalid { key, reason: format!("{v} is too large") })
}

fn seconds(key: &'static str, v: f64) -> Result<Duration, ConfigError> {
    if !(v.is_finite() && v > 0.0 && v < 1e7) {
        return Err(ConfigError::Invalid { key, reason: format!("must be a positive number of seconds, got {v}") });
    }
    Ok(Duration::from_secs_f64(v))
}

fn name(key: &'static str, v: String) -> Result<String, ConfigError> {
    if v.is_empty() || v.len() > 255 {
        return Err(ConfigError::Invalid { key, reason: "must be 1 to 255 bytes long".into() });
    }
    Ok(v)
}

impl RawConfig {
    /// Checks every value and converts to the typed [`Config`].
    pub fn validate(self) -> Result<Config, ConfigError> {
        let a = self.amqp;
        let scheme_ok = a.url.expose().starts_with("amqp://") || a.url.expose().starts_with("amqps://");
        if !scheme_ok {
            return Err(ConfigError::Invalid { key: "amqp.url", reason: "must start with amqp:// or amqps://".into() });
        }
        let delivery_limit = positive("amqp.delivery_limit", a.delivery_limit)?;
        if a.prefetch < 0 || a.prefetch > i64::from(u16::MAX) {
            return Err(ConfigError::Invalid { key: "amqp.prefetch", reason: format!("must be 0..=65535, got {}", a.prefetch) });
        }
        let amqp = AmqpConfig {
            url: a.url,
            exchange: name("amqp.exchange", a.exchange)?,
            routing_key: name("amqp.routing_key", a.routing_key)?,
            queue: name("amqp.queue", a.queue)?,
            dead_letter_exchange: name("amqp.dead_letter_exchange", a.dead_letter_exchange)?,
            dead_letter_queue: name("amqp.dead_letter_queue", a.dead_letter_queue)?,
            delivery_limit: u32::try_from(delivery_limit).unwrap_or(u32::MAX),
            prefetch: a.prefetch as u16,
            reconnect_min: seconds("amqp.reconnect_min_secs", a.reconnect_min_secs)?,
            reconnect_max: seconds("amqp.reconnect_max_secs", a.reconnect_max_secs)?,
        };

        let d = self.database;
        if !(d.url.expose().starts_with("postgres://") || d.url.expose().starts_with("postgresql://")) {
            return Err(ConfigError::Invalid { key: "database.url", reason: "must start with postgres://".into() });
        }
        let database = DatabaseConfig {
            url: d.url,
            max_connections: positive("database.max_connections", d.max_connections)? as u32,
        };

        let s = self.storage;
        let target = if let Some(bucket) = s.url.strip_prefix("s3://") {
            let bucket = bucket.trim_end_matches('/');
            let valid = (3..=63).contains(&bucket.len())
                && bucket.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
            if !valid {
                return Err(ConfigError::Invalid {
                    key: "storage.url",
                    reason: format!("`{bucket}` is not a valid bucket name (3-63 of a-z 0-9 . -)"),
                });
            }
            StorageTarget::S3 { bucket: bucket.to_string() }
        } else if let Some(root) = s.url.strip_prefix("file://") {
            if !root.starts_with('/') {
                return Err(ConfigError::Invalid { key: "storage.url", reason: "file:// needs an absolute path, e.g. file:///data/audio".into() });
            }
            StorageTarget::File { root: PathBuf::from(root) }
        } else {
            return Err(ConfigError::Invalid { key: "storage.url", reason: format!("`{}` must be s3://BUCKET or file:///DIR", s.url) });
        };
        if s.key_prefix.starts_with('/') || s.key_prefix.contains("..") {
            return Err(ConfigError::Invalid { key: "storage.key_prefix", reason: "must be relative and must not contain `..`".into() });
        }
        let storage = StorageConfig {
            target,
            key_prefix: s.key_prefix,
            endpoint: Some(s.endpoint).filter(|e| !e.is_empty()),
            region: s.region,
            force_path_style: s.force_path_style,
            access_key_id: s.access_key_id,
            secret_access_key: s.secret_access_key,
            create_bucket: s.create_bucket,
            upload_concurrency: positive("storage.upload_concurrency", s.upload_concurrency)?,
        };

        let m = self.model;
        let model = ModelConfig {
            dir: m.dir,
            device: m.device.parse().map_err(|reason| ConfigError::Invalid { key: "model.device", reason })?,
            precision: m.precision.parse().map_err(|reason| ConfigError::Invalid { key: "model.precision", reason })?,
            cpu_threads: usize::try_from(m.cpu_threads)
                .map_err(|_| ConfigError::Invalid { key: "model.cpu_threads", reason: "must be >= 0".into() })?,
        };

        let b = self.batching;
        let batching = BatchingConfig {
            max_batch: positive("batching.max_batch", b.max_batch)?,
            max_wait: Duration::from_millis(
                u64::try_from(b.max_wait_ms)
                    .map_err(|_| ConfigError::Invalid { key: "batching.max_wait_ms", reason: "must be >= 0".into() })?,
            ),
            max_batch_tokens: positive("batching.max_batch_tokens", b.max_batch_tokens)?,
            max_length_ratio: if b.max_length_ratio >= 1.0 && b.max_length_ratio.is_finite() {
                b.max_length_ratio
            } else {
                return Err(ConfigError::Invalid { key: "batching.max_length_ratio", reason: format!("must be >= 1, got {}", b.max_length_ratio) });
            },
        };

        let l = self.limits;
        let limits = Limits {
            max_text_chars: positive("limits.max_text_chars", l.max_text_chars)?,
            max_message_bytes: positive("limits.max_message_bytes", l.max_message_bytes)?,
            max_speech_tokens: positive("limits.max_speech_tokens", l.max_speech_tokens)?,
        };

        let w = self.worker;
        let worker = WorkerConfig {
            id: Some(w.id).filter(|s| !s.is_empty()),
            heartbeat: seconds("worker.heartbeat_secs", w.heartbeat_secs)?,
            retry_min: seconds("worker.retry_min_secs", w.retry_min_secs)?,
            retry_max: seconds("worker.retry_max_secs", w.retry_max_secs)?,
            max_hold: {
                let d = seconds("worker.max_hold_secs", w.max_hold_secs)?;
                if d > Duration::from_secs(600) {
                    return Err(ConfigError::Invalid {
                        key: "worker.max_hold_secs",
                        reason: "must be at most 600 s: three stages of it must stay inside RabbitMQ's 30-minute consumer timeout".into(),
                    });
                }
                d
            },
            drain_poll: Duration::from_millis(positive("worker.drain_poll_ms", w.drain_poll_ms)? as u64),
        };
        let m = self.memory;
        let fraction = |key: &'static str, v: f64| {
            if v > 0.0 && v <= 1.0 {
                Ok(v)
            } else {
                Err(ConfigError::Invalid { key, reason: format!("must be in (0, 1], got {v}") })
            }
        };
        let memory = MemoryConfig {
            policy: match m.policy.as_str() {
                "memory" => SizingPolicy::Memory,
                "tokens" => SizingPolicy::Tokens,
                other => return Err(ConfigError::Invalid { key: "memory.policy", reason: format!("`{other}`: use memory or tokens") }),
            },
            vram_fraction: fraction("memory.vram_fraction", m.vram_fraction)?,
            budget_bytes: match m.budget_bytes {
                0 => None,
                b if b > 0 => Some(b as u64),
                b => return Err(ConfigError::Invalid { key: "memory.budget_bytes", reason: format!("must be >= 0, got {b}") }),
            },
            safety_margin_bytes: u64::try_from(m.safety_margin_bytes)
                .map_err(|_| ConfigError::Invalid { key: "memory.safety_margin_bytes", reason: "must be >= 0".into() })?,
            aimd: crate::batch::memory::Aimd {
                initial: fraction("memory.safety_initial", m.safety_initial)?,
                backoff: fraction("memory.oom_backoff", m.oom_backoff)?,
                step: fraction("memory.recover_step", m.recover_step)?,
                recover_after: u32::try_from(positive("memory.recover_after", m.recover_after)?).unwrap_or(u32::MAX),
                floor: 0.2,
            },
            calibration_dir: m.calibration_dir,
        };
        let c = self.cost;
        let price = |key: &'static str, v: f64| {
            if v >= 0.0 && v.is_finite() {
                Ok(v)
            } else {
                Err(ConfigError::Invalid { key, reason: format!("must be a price >= 0, got {v}") })
            }
        };
        for v in c.gpu_hourly_usd.values() {
            price("cost.gpu_hourly_usd", *v)?;
        }
        let cost = CostConfig {
            prices: crate::cost::Prices {
                gpu_hourly_usd: c.gpu_hourly_usd,
                cpu_hourly_usd: price("cost.cpu_hourly_usd", c.cpu_hourly_usd)?,
                default_gpu_hourly_usd: price("cost.default_gpu_hourly_usd", c.default_gpu_hourly_usd)?,
                energy_usd_per_kwh: price("cost.energy_usd_per_kwh", c.energy_usd_per_kwh)?,
            },
            sample_interval: Duration::from_millis(positive("cost.sample_interval_ms", c.sample_interval_ms)? as u64),
        };
        Ok(Config { amqp, database, storage, model, batching, limits, worker, memory, cost })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn defaults_are_valid_and_match_the_public_contract() {
        let c = Config::defaults().unwrap();
        assert_eq!(c.amqp.url.expose(), "amqp://guest:guest@127.0.0.1:5672/%2f");
        assert_eq!(c.amqp.exchange, "voxbatch");
        assert_eq!(c.amqp.queue, "voxbatch.jobs");
        assert_eq!(c.amqp.routing_key, "jobs");
        assert_eq!(c.amqp.dead_letter_exchange, "voxbatch.dlx");
        assert_eq!(c.amqp.dead_letter_queue, "voxbatch.jobs.dead");
        assert_eq!(c.amqp.delivery_limit, 5);
        assert_eq!(c.database.url.expose(), "postgres://postgres@127.0.0.1:5432/voxbatch");
        assert!(matches!(c.storage.target, StorageTarget::S3 { ref bucket } if bucket == "voxbatch"));
        assert_eq!(c.storage.endpoint.as_deref(), Some("http://127.0.0.1:8333"));
        assert_eq!(c.limits.max_text_chars, 20_000);
    }

    #[test]
    fn env_overrides_sections_and_standard_variables() {
        let c = Config::load(
            None,
            &env(&[
                ("VOXBATCH_BATCHING__MAX_BATCH", "32"),
                ("VOXBATCH_STORAGE__URL", "file:///tmp/audio"),
                ("DATABASE_URL", "postgres://u:pw@db/x"),
                ("AMQP_URL", "amqps://u:pw@mq/%2f"),
                ("S3_ENDPOINT", "https://s3.example"),
                ("UNRELATED", "1"),
            ]),
        )
        .unwrap();
        assert_eq!(c.batching.max_batch, 32);
        assert!(matches!(c.storage.target, StorageTarget::File { .. }));
        assert_eq!(c.database.url.expose(), "postgres://u:pw@db/x");
        assert_eq!(c.amqp.url.expose(), "amqps://u:pw@mq/%2f");
        assert_eq!(c.storage.endpoint.as_deref(), Some("https://s3.example"));
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "[batching]\nmax_bacth = 3\n").unwrap();
        assert!(matches!(Config::load(Some(&p), &BTreeMap::new()), Err(ConfigError::Shape(_))));
        let e = Config::load(None, &env(&[("VOXBATCH_BATCHING__MAX_BATCH", "0")])).unwrap_err();
        assert!(e.to_string().contains("batching.max_batch"), "{e}");
        let e = Config::load(None, &env(&[("VOXBATCH_NOPE__X", "1")])).unwrap_err();
        assert!(matches!(e, ConfigError::UnknownEnvSection { .. }));
        let e = Config::load(None, &env(&[("VOXBATCH_STORAGE__URL", "ftp://x")])).unwrap_err();
        assert!(e.to_string().contains("storage.url"));
    }

    #[test]
    fn secrets_are_redacted_in_debug_output() {
        let c = Config::load(
            None,
            &env(&[("AMQP_URL", "amqp://u:hunter2@mq/%2f"), ("AWS_SECRET_ACCESS_KEY", "s3cr3tkey")]),
        )
        .unwrap();
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("hunter2"), "{dbg}");
        assert!(!dbg.contains("s3cr3tkey"), "{dbg}");
        assert!(dbg.contains("***"));
    }
}
