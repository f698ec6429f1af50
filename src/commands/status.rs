//! `voxbatch status`: queue depths and jobs by status.

use super::CommandError;
use crate::config::Config;
use crate::db::Db;
use crate::queue::{self, QueueError};

/// Queue depths and job counts.
#[derive(Debug, Clone)]
pub struct Status {
    pub queue: String,
    pub ready: u32,
    pub dead_letter_queue: String,
    pub dead: u32,
    pub jobs_by_status: Vec<(String, i64)>,
}

pub async fn status(cfg: &Config) -> Result<Status, CommandError> {
    let conn = queue::connect(&cfg.amqp, "voxbatch status").await?;
    let channel = conn.create_channel().await.map_err(|source| QueueError::Amqp { op: "channel.open", source })?;
    let (ready, dead) = queue::queue_depths(&channel, &cfg.amqp).await?;
    let _ = conn.close(200, "done".into()).await;
    let db = Db::connect(&cfg.database).await?;
    let jobs_by_status = db.jobs_by_status(None).await?;
    Ok(Status { queue: cfg.amqp.queue.clone(), ready, dead_letter_queue: cfg.amqp.dead_letter_queue.clone(), dead, jobs_by_status })
}
