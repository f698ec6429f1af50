//! `voxbatch audit`: a campaign's `done` rows against the stored objects. Every row's object must
//! exist with the size the row recorded; `--deep` also reads each object and checks its sha256 and
//! the batch its metadata names against the row (the object a `done` row names is the one it
//! describes: `worker::commit`'s fence). Objects no row names are listed as orphans.
//!
//! Neighbours: `db` (the rows), `storage` (listing, reading); `main.rs` prints [`Audit`]
//! (`report::Render`).

use std::collections::BTreeMap;
use std::fmt;

use sha2::{Digest, Sha256};
use sqlx::Row;

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
    /// Whether each object was read and hashed (`--deep`).
    pub deep: bool,
    /// Done rows whose object is missing.
    pub missing_objects: Vec<String>,
    /// Objects whose size differs from what their row recorded.
    pub size_mismatches: Vec<String>,
    /// Objects whose bytes' sha256, or the batch their metadata names, differ from their row's
    /// (`--deep` only).
    pub content_mismatches: Vec<String>,
    /// Objects with no done row (e.g. uploaded before a crash, then never committed).
    pub orphan_objects: Vec<String>,
}

impl Audit {
    /// Rows whose object is missing or is not the one the row describes.
    pub fn problems(&self) -> usize {
        self.missing_objects.len() + self.size_mismatches.len() + self.content_mismatches.len()
    }
}

/// A done row as audit compares it.
struct DoneRow {
    sha256: Option<String>,
    bytes: Option<i64>,
    batch_id: Option<uuid::Uuid>,
}

/// Checks that every `done` job of `campaign` has its audio object as its row describes it (size;
/// with `deep`, sha256 and batch) and lists objects no done row points to.
pub async fn audit(cfg: &Config, campaign: &str, deep: bool) -> Result<Audit, CommandError> {
    // An empty or odd campaign would list other campaigns' objects (or all) as orphans.
    let valid = !campaign.is_empty() && !campaign.starts_with('.') && campaign.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !valid {
        return Err(CommandError::Usage(format!("--campaign `{}`: name one campaign (A-Z a-z 0-9 . _ -)", crate::job::escape_controls(campaign))));
    }
    let db = Db::connect(&cfg.database).await?;
    let storage = Storage::open(&cfg.storage).await?;
    let rows: BTreeMap<String, DoneRow> = sqlx::query(
        "SELECT s3_key, audio_sha256, audio_bytes, batch_id FROM jobs WHERE status = 'done' AND campaign = $1 AND s3_key IS NOT NULL",
    )
    .bind(campaign)
    .fetch_all(db.pool())
    .await
    .map_err(|source| DbError::Query { context: "audit", source })?
    .into_iter()
    .map(|r| (r.get(0), DoneRow { sha256: r.get(1), bytes: r.get(2), batch_id: r.get(3) }))
    .collect();
    let objects: BTreeMap<String, u64> = storage.list_sizes(&storage.campaign_prefix(campaign)).await?.into_iter().collect();
    let mut audit = Audit {
        campaign: campaign.to_string(),
        done_rows: rows.len(),
        objects: objects.len(),
        deep,
        missing_objects: Vec::new(),
        size_mismatches: Vec::new(),
        content_mismatches: Vec::new(),
        orphan_objects: objects.keys().filter(|k| !rows.contains_key(*k)).cloned().collect(),
    };
    for (key, row) in &rows {
        let Some(&size) = objects.get(key) else {
            audit.missing_objects.push(key.clone());
            continue;
        };
        if row.bytes.is_some_and(|b| b as u64 != size) {
            audit.size_mismatches.push(key.clone());
            continue;
        }
        if deep {
            let (bytes, meta) = storage.get(key).await?;
            let sha = hex::encode(Sha256::digest(&bytes));
            let batch_matches = match (meta.get("batch-id"), row.batch_id) {
                (Some(stored), Some(row)) => stored == &row.to_string(),
                _ => true, // objects stored before the batch was recorded in their metadata
            };
            if row.sha256.as_deref() != Some(sha.as_str()) || !batch_matches {
                audit.content_mismatches.push(key.clone());
            }
        }
    }
    Ok(audit)
}

impl crate::report::Render for Audit {
    fn text(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Audit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let esc = crate::job::escape_controls;
        writeln!(f, "campaign {}: {} done row(s), {} object(s){}", esc(&self.campaign), self.done_rows, self.objects, if self.deep { ", each read and hashed" } else { "" })?;
        let lists: [(&str, &Vec<String>); 4] = [
            ("missing objects", &self.missing_objects),
            ("objects of another size than their row's", &self.size_mismatches),
            ("objects whose sha256 or batch differ from their row's", &self.content_mismatches),
            ("orphan objects (no done row names them)", &self.orphan_objects),
        ];
        for (what, keys) in lists {
            if what.starts_with("objects whose") && !self.deep {
                writeln!(f, "{what}: not checked (--deep reads every object)")?;
                continue;
            }
            writeln!(f, "{what}: {}", keys.len())?;
            for k in keys.iter().take(20) {
                writeln!(f, "  {}", esc(k))?;
            }
            if keys.len() > 20 {
                writeln!(f, "  … and {} more (--format json lists all)", keys.len() - 20)?;
            }
        }
        Ok(())
    }
}
