//! `voxbatch audit`: done rows of a campaign against the stored objects.

use super::CommandError;
use crate::config::Config;
use crate::db::{Db, DbError};
use crate::storage::Storage;

/// What `audit` found for a campaign.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Audit {
    pub campaign: String,
    pub done_rows: usize,
    pub objects: usize,
    /// Done rows whose object is missing.
    pub missing_objects: Vec<String>,
    /// Objects with no done row (e.g. uploaded before a crash, then never committed).
    pub orphan_objects: Vec<String>,
}

/// Checks that every `done` job of `campaign` has its audio object and lists objects no done row
/// points to.
pub async fn audit(cfg: &Config, campaign: &str) -> Result<Audit, CommandError> {
    // An empty or odd campaign would list other campaigns' objects (or all) as orphans.
    let valid = !campaign.is_empty() && !campaign.starts_with('.') && campaign.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !valid {
        return Err(CommandError::Usage(format!("--campaign `{}`: name one campaign (A-Z a-z 0-9 . _ -)", crate::job::escape_controls(campaign))));
    }
    let db = Db::connect(&cfg.database).await?;
    let storage = Storage::open(&cfg.storage).await?;
    let keys: Vec<String> = sqlx::query_scalar("SELECT s3_key FROM jobs WHERE status = 'done' AND campaign = $1 AND s3_key IS NOT NULL")
        .bind(campaign)
        .fetch_all(db.pool())
        .await
        .map_err(|source| DbError::Query { context: "audit", source })?;
    let objects: std::collections::BTreeSet<String> = storage.list(&storage.campaign_prefix(campaign)).await?.into_iter().collect();
    let rows: std::collections::BTreeSet<String> = keys.into_iter().collect();
    Ok(Audit {
        campaign: campaign.to_string(),
        done_rows: rows.len(),
        objects: objects.len(),
        missing_objects: rows.difference(&objects).cloned().collect(),
        orphan_objects: objects.difference(&rows).cloned().collect(),
    })
}
