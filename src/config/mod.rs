//! Configuration: one typed [`Config`], read in two stages, a file per section.
//!
//! 1. Layers of TOML are merged into one table: the built-in `config/default.toml`, then the
//!    user's file, then environment overrides (`VOXBATCH_SECTION__KEY` and the usual `AMQP_URL`,
//!    `DATABASE_URL`, `S3_ENDPOINT`, `AWS_*`). The environment is passed in as a map, never read
//!    from globals here, so this module is testable.
//! 2. The merged table is deserialised into [`RawConfig`] (`deny_unknown_fields`: a typo is an
//!    error, not a silently ignored key) and each section's `validate` turns it into [`Config`].
//!    Durations are written as `250ms`, `5s`, `2m`.
//!
//! Neighbours: `main.rs` applies CLI flags on top; every other module takes its section.

mod amqp;
mod batching;
mod check;
mod cost;
mod database;
mod frontend;
mod llm;
mod memory;
mod metrics;
mod model;
mod output;
mod secret;
mod storage;
mod voices;
mod worker;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use amqp::{AmqpConfig, RawAmqp};
pub use batching::{BatchingConfig, Limits, RawBatching, RawLimits};
pub use cost::{CostConfig, RawCost};
pub use database::{DatabaseConfig, RawDatabase};
pub use frontend::{FrontendConfig, RawFrontend};
pub use llm::{LlmConfig, RawLlm};
pub use memory::{MemoryConfig, RawMemory, SizingPolicy};
pub use metrics::{MetricsConfig, RawMetrics};
pub use model::{BatchProfile, FlowGraphSettings, ModelConfig, RawModel};
pub use output::{OutputConfig, RawOutput};
pub use secret::{redact_url, Secret, SecretUrl};
pub use storage::{RawStorage, StorageConfig, StorageTarget};
pub use voices::{RawVoices, VoicesConfig};
pub use worker::{RawWorker, WorkerConfig};

/// The defaults, built into the binary so that it runs with no file around.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

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
    pub llm: RawLlm,
    pub frontend: RawFrontend,
    pub voices: RawVoices,
    pub cost: RawCost,
    pub metrics: RawMetrics,
    pub output: RawOutput,
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
    pub llm: LlmConfig,
    pub frontend: FrontendConfig,
    pub voices: VoicesConfig,
    pub cost: CostConfig,
    pub metrics: MetricsConfig,
    pub output: OutputConfig,
}

impl RawConfig {
    /// Checks every section and converts to the typed [`Config`].
    pub fn validate(self) -> Result<Config, ConfigError> {
        Ok(Config {
            amqp: self.amqp.validate()?,
            database: self.database.validate()?,
            storage: self.storage.validate()?,
            model: self.model.validate()?,
            batching: self.batching.validate()?,
            limits: self.limits.validate()?,
            worker: self.worker.validate()?,
            memory: self.memory.validate()?,
            llm: self.llm.validate()?,
            frontend: self.frontend.validate()?,
            voices: self.voices.validate()?,
            cost: self.cost.validate()?,
            metrics: self.metrics.validate()?,
            output: self.output.validate()?,
        })
    }
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

/// `VOXBATCH_*` variables that are not configuration keys (the CLI's and the scripts').
const OTHER_VOXBATCH_VARS: &[&str] = &["VOXBATCH_CONFIG", "VOXBATCH_ROOT", "VOXBATCH_SKIP_BUILD"];

impl Config {
    /// Loads the defaults, `file` (if any) and `env` overrides, then validates.
    pub fn load(file: Option<&Path>, env: &BTreeMap<String, String>) -> Result<Config, ConfigError> {
        let mut table: toml::Table =
            DEFAULT_TOML.parse().map_err(|source| ConfigError::Parse { path: PathBuf::from("<built-in config/default.toml>"), source })?;
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
            let user: toml::Table = text.parse().map_err(|source| ConfigError::Parse { path: path.to_path_buf(), source })?;
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

/// `VOXBATCH_*` names in `env` that set nothing (e.g. a single underscore between section and
/// key): the CLI warns about each.
pub fn unknown_env_vars(env: &BTreeMap<String, String>) -> Vec<String> {
    env.keys()
        .filter(|k| k.starts_with("VOXBATCH_") && !k.contains("__") && !OTHER_VOXBATCH_VARS.contains(&k.as_str()) && !k.starts_with("VOXBATCH_TEST_"))
        .cloned()
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn defaults_are_valid_and_match_the_public_contract() {
        let c = Config::defaults().unwrap();
        assert_eq!(c.amqp.url().expose(), "amqp://guest:guest@127.0.0.1:5672/%2f");
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
        assert!(!c.model.cudnn_benchmark, "cuDNN benchmark mode is off by default, as the official code runs");
        assert!(!c.model.cudnn_attention, "cuDNN's attention is off by default: it builds a graph per bucket shape");
    }

    #[test]
    fn env_overrides_sections_and_standard_variables() {
        let c = Config::load(
            None,
            &env(&[
                ("VOXBATCH_BATCHING__MAX_BATCH", "32"),
                ("VOXBATCH_STORAGE__URL", "file:///tmp/audio"),
                ("VOXBATCH_MODEL__CUDNN_BENCHMARK", "true"),
                ("VOXBATCH_MODEL__CUDNN_ATTENTION", "true"),
                ("DATABASE_URL", "postgres://u:pw@db/x"),
                ("AMQP_URL", "amqps://u:pw@mq/%2f"),
                ("S3_ENDPOINT", "https://s3.example"),
                ("UNRELATED", "1"),
            ]),
        )
        .unwrap();
        assert_eq!(c.batching.max_batch, 32);
        assert!(c.model.cudnn_benchmark);
        assert!(c.model.cudnn_attention);
        assert!(matches!(c.storage.target, StorageTarget::File { .. }));
        assert_eq!(c.database.url.expose(), "postgres://u:pw@db/x");
        assert_eq!(c.amqp.url().expose(), "amqps://u:pw@mq/%2f");
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
    fn durations_are_written_with_units() {
        let c = Config::load(None, &env(&[("VOXBATCH_WORKER__MAX_HOLD", "90s"), ("VOXBATCH_BATCHING__MAX_WAIT", "0ms")])).unwrap();
        assert_eq!(c.worker.max_hold, std::time::Duration::from_secs(90));
        assert!(c.batching.max_wait.is_zero());
        let e = Config::load(None, &env(&[("VOXBATCH_WORKER__HEARTBEAT", "10")])).unwrap_err();
        assert!(e.to_string().contains("worker.heartbeat"), "{e}");
        let e = Config::load(None, &env(&[("VOXBATCH_WORKER__MAX_HOLD", "20m")])).unwrap_err();
        assert!(e.to_string().contains("at most 10m"), "{e}");
    }

    #[test]
    fn voxbatch_variables_that_set_nothing_are_reported() {
        let e = env(&[("VOXBATCH_BATCHING_MAX_BATCH", "3"), ("VOXBATCH_CONFIG", "x"), ("VOXBATCH_BATCHING__MAX_BATCH", "3"), ("VOXBATCH_TEST_MODEL", "m")]);
        assert_eq!(unknown_env_vars(&e), vec!["VOXBATCH_BATCHING_MAX_BATCH".to_string()]);
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
