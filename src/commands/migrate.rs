//! `voxbatch migrate`: database, migrations, queue topology, bucket. Idempotent.

use super::{open_services, CommandError};
use crate::config::Config;
use crate::queue::{self, QueueError};

/// Creates the database (if missing), applies migrations, declares the queue topology and creates
/// the bucket.
pub async fn migrate(cfg: &Config) -> Result<(), CommandError> {
    open_services(cfg).await?;
    let conn = queue::connect(&cfg.amqp, "voxbatch migrate").await?;
    let channel = conn.create_channel().await.map_err(|source| QueueError::Amqp { op: "channel.open", source })?;
    queue::declare_topology(&channel, &cfg.amqp).await?;
    let _ = conn.close(200, "done".into()).await;
    Ok(())
}
