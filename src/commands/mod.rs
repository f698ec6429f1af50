//! What each CLI command does, a file per command, as library functions: tests and the demo call
//! the same code the binary does. `main.rs` parses flags, calls one of these and prints what it
//! returns: each result type renders itself (`report::Render`: text with one table style,
//! publisher-controlled fields escaped; CSV where it is one table; JSON).
//!
//! Neighbours: everything; this is the top of the library.

mod audit;
mod bench;
mod calibrate;
mod campaign;
mod dead;
mod demo;
mod enqueue;
mod migrate;
mod report;
mod status;
mod text;
mod voice;
mod work;

pub use audit::{audit, Audit};
pub use bench::{bench, bench_corpus, bench_llm, bench_policy, bench_sweetspot, bench_token2wav, written_text, BenchRun};
pub use calibrate::{calibrate, calibrated_text, calibration_point_header, calibration_point_text};
pub use campaign::{campaign_progress, cancel, cancel_text, watch_campaign, CampaignProgress};
pub use dead::{dead, dead_until, DeadAction, DeadFilter, DeadReport, DeadRow};
pub use demo::{demo, DemoSummary};
pub use enqueue::{enqueue, publish_with_retry, EnqueueSummary};
pub use migrate::migrate;
pub use report::{report, write_plot};
pub use status::{status, Status};
pub use text::{text_dry_run, text_table, TextReport};
pub use voice::{voice_add, voice_list, voice_rm, voice_rm_text, voice_show, AddedVoice, VoiceAdd};
pub use work::{parse_devices, work, ParseDevicesError};

use crate::config::Config;
use crate::db::{Db, DbError};
use crate::enqueue::EnqueueError;
use crate::model::{Device, ModelError, ModelHandle};
use crate::queue::QueueError;
use crate::storage::{Storage, StorageError};
use crate::worker::WorkerError;

/// Errors of the commands, each with the stage it came from.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Enqueue(#[from] EnqueueError),
    #[error(transparent)]
    Worker(#[from] WorkerError),
    #[error(transparent)]
    Calibrate(#[from] crate::calibrate::CalibrateError),
    #[error(transparent)]
    Sizing(#[from] crate::sizing::SizingError),
    #[error(transparent)]
    Profile(#[from] crate::sizing::ProfileError),
    #[error(transparent)]
    Plot(#[from] crate::plot::PlotError),
    #[error(transparent)]
    Voice(#[from] crate::voice::prompt::PromptError),
    #[error("the text frontend")]
    Frontend(#[from] crate::frontend::FrontendError),
    #[error("cannot {what}")]
    Io { what: &'static str, source: std::io::Error },
    #[error("{0}")]
    Usage(String),
    /// A command that moves things one at a time failed part-way: `done` says what it had done.
    #[error("{what} stopped part-way: {done}")]
    PartWay { what: &'static str, done: String, source: Box<CommandError> },
    /// A service stayed unreachable for the time `key` allows.
    #[error("{service} unreachable for {after} with no progress ({key}): giving up")]
    GaveUp { service: &'static str, key: &'static str, after: String, source: Box<CommandError> },
    /// `enqueue` stopped on an error after publishing the file's first `published` jobs
    /// (`--skip published` resumes).
    #[error("{published} of {total} job(s) of the file published before it stopped")]
    EnqueueStopped { published: usize, total: usize, source: Box<CommandError> },
}

/// What to check when `e` is an error waiting will not fix (refused credentials or access).
pub fn hint(e: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    // Transparent variants do not show their inner error in the chain, nor does a boxed source
    // (`PartWay`, `GaveUp`, `EnqueueStopped`: the chain holds the box): look inside.
    if let Some(inner) = e.downcast_ref::<Box<CommandError>>() {
        return hint(inner.as_ref());
    }
    match e.downcast_ref::<CommandError>() {
        Some(CommandError::Worker(w)) => return hint(w),
        Some(CommandError::Storage(s)) => return hint(s),
        Some(CommandError::Queue(q)) => return hint(q),
        Some(CommandError::Db(d)) => return hint(d),
        _ => {}
    }
    if let Some(WorkerError::Permanent { hint, .. }) = e.downcast_ref::<WorkerError>() {
        return *hint;
    }
    crate::worker::retry::permanent_hint(e)
}

/// Resolves on SIGINT or SIGTERM: the `shutdown` the binary gives commands that stop cleanly
/// (`work`, `enqueue`, `dead`, `demo`; tests inject their own).
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else {
            let _ = ctrl_c.await;
            return;
        };
        tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutdown requested: finishing what is in flight, returning the rest to the queue");
}

/// What `work` (and the demo) says of each worker when it stops.
pub fn worker_text(s: &crate::worker::WorkerSummary) -> String {
    format!(
        "worker {}: {} batch(es), {} job(s) done, {} failed, {} already done, {} cancelled, {} rejected, {:.1} s of audio\n",
        crate::job::escape_controls(&s.worker_id),
        s.batches,
        s.jobs_done,
        s.jobs_failed,
        s.already_done,
        s.cancelled,
        s.rejected,
        s.audio_seconds
    )
}

impl crate::report::Render for TextReport {
    fn text(&self) -> String {
        text_table(self)
    }
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> CommandError {
    move |source| CommandError::Io { what, source }
}

/// Starts loading the configured model on `device` (`ModelHandle::start`: returns while its
/// thread loads it): the one way commands load a model. A text model (`cosyvoice2`,
/// `cosyvoice3`) is sized first (`sizing::text_plan`: NVML and files, off the async runtime), or
/// with `token2wav_only` loads its token2wav half alone (`LoadOptions::token2wav_only`).
async fn start_model(cfg: &Config, device: Device, token2wav_only: bool) -> Result<ModelHandle, CommandError> {
    let sized = cfg.clone();
    tokio::task::spawn_blocking(move || -> Result<_, CommandError> {
        let m = &sized.model;
        let manifest = crate::model::Manifest::load(&m.dir)?;
        let mut options = crate::model::LoadOptions {
            cpu_threads: m.cpu_threads,
            text: None,
            flow_graphs: m.flow_graphs,
            cudnn_benchmark: m.cudnn_benchmark,
            cudnn_attention: m.cudnn_attention,
            token2wav_only,
            // A measurement (calibrate, the policy bench) is not profiled: the profiler's own
            // memory and time would be measured with it.
            profile: if token2wav_only { None } else { m.profile.clone() },
        };
        if options.loads_text(manifest.kind) {
            options.text = Some(crate::sizing::text_plan(&sized, &manifest, device, m.precision)?);
        }
        Ok(ModelHandle::start(&m.dir, device, m.precision, options)?)
    })
    .await
    .map_err(|_| ModelError::ThreadGone)?
}

/// The model whose batches a measurement runs (`calibrate`, the policy bench), once loaded: a
/// text model's token2wav half alone, since the memory policy sizes token2wav batches.
async fn load_model(cfg: &Config, device: Device) -> Result<ModelHandle, CommandError> {
    let model = start_model(cfg, device, true).await?;
    model.ready().await?;
    Ok(model)
}

/// Connects to Postgres, creating the database and applying migrations.
pub async fn open_db(cfg: &Config) -> Result<Db, CommandError> {
    let db = Db::connect(&cfg.database).await?;
    db.migrate().await?;
    Ok(db)
}

/// Connects to Postgres ([`open_db`]) and opens the audio store (creating the bucket when
/// configured to).
async fn open_services(cfg: &Config) -> Result<(Db, Storage), CommandError> {
    let db = open_db(cfg).await?;
    let storage = Storage::open(&cfg.storage).await?;
    storage.ensure_ready(cfg.storage.create_bucket).await?;
    Ok((db, storage))
}
