//! `[database]`: the Postgres URL and pool.

use serde::Deserialize;

use super::check::positive;
use super::{ConfigError, SecretUrl};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDatabase {
    pub url: SecretUrl,
    pub max_connections: i64,
}

#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    pub url: SecretUrl,
    pub max_connections: u32,
}

impl RawDatabase {
    pub fn validate(self) -> Result<DatabaseConfig, ConfigError> {
        if !(self.url.expose().starts_with("postgres://") || self.url.expose().starts_with("postgresql://")) {
            return Err(ConfigError::Invalid { key: "database.url", reason: "must start with postgres://".into() });
        }
        let max_connections = positive("database.max_connections", self.max_connections)?;
        Ok(DatabaseConfig { url: self.url, max_connections: u32::try_from(max_connections).unwrap_or(u32::MAX) })
    }
}
