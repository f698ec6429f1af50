//! `voxbatch cancel --campaign C [--resume]`: stop or restart a campaign. The cancel is a row in
//! Postgres that every worker's claim transaction reads (`db::claim`): jobs of the campaign not yet
//! done are marked `cancelled` and acked without synthesis; batches already claimed finish.
//!
//! Neighbours: `db::claim` (where the cancel takes effect), `commands::status` (progress).

use super::{open_db, CommandError};
use crate::config::Config;

/// Cancels `campaign` (or resumes it); `true` when that changed something.
pub async fn cancel(cfg: &Config, campaign: &str, resume: bool) -> Result<bool, CommandError> {
    crate::job::check_name(campaign).map_err(|e| CommandError::Usage(format!("campaign {campaign:?}: {e}")))?;
    let db = open_db(cfg).await?;
    Ok(if resume { db.resume_campaign(campaign).await? } else { db.cancel_campaign(campaign).await? })
}
