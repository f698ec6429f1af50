//! `voxbatch work`: one worker per device (× workers per device) in this process, each with its
//! own model, CUDA device, calibration profile, NVML sampler and `workers` row, all consuming the
//! same queue; one shutdown stops them all (each finishes its batch in progress). The models load
//! at once, each while its worker connects, consumes and prepares text (`ModelHandle::start`).

use std::future::Future;

use tokio_util::sync::CancellationToken;

use super::{open_services, start_model, CommandError};
use crate::config::Config;
use crate::model::Device;
use crate::worker::{self, new_worker_id, WorkerError, WorkerOptions, WorkerSummary};

/// Runs the workers until `shutdown` (or, with `drain`, until the queue is empty). With one
/// worker in all, its id is `opts.worker_id` (or `worker.id`, or a fresh one); with several,
/// each gets that base id with `-<device>-<k>` appended.
pub async fn work(
    cfg: &Config,
    devices: &[Device],
    per_device: usize,
    opts: WorkerOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<Vec<WorkerSummary>, CommandError> {
    let (db, storage) = open_services(cfg).await?;
    let stop = CancellationToken::new();
    let base_id = opts.worker_id.clone().or_else(|| cfg.worker.id.clone()).unwrap_or_else(new_worker_id);
    let per_device = per_device.max(1);
    let single = devices.len() * per_device == 1;
    let mut runs = Vec::new();
    for &device in devices {
        for k in 0..per_device {
            let mut c = cfg.clone();
            c.model.device = device;
            // Each model loads on its own thread while its worker starts consuming.
            let model = start_model(&c, device, false).await?;
            let id = if single { base_id.clone() } else { format!("{base_id}-{}-{k}", device.to_string().replace(':', "")) };
            let o = WorkerOptions { drain: opts.drain, worker_id: Some(id) };
            let (db, storage, stop) = (db.clone(), storage.clone(), stop.clone());
            runs.push(tokio::spawn(async move { worker::run(c, model, db, storage, o, async move { stop.cancelled().await }).await }));
        }
    }
    let all = futures::future::join_all(runs);
    tokio::pin!(all);
    tokio::pin!(shutdown);
    let results = tokio::select! {
        r = &mut all => r,
        _ = &mut shutdown => {
            stop.cancel();
            all.await
        }
    };
    results
        .into_iter()
        .map(|r| r.map_err(|e| WorkerError::Stage(format!("worker task: {e}")))?.map_err(CommandError::from))
        .collect()
}

/// Why a `--devices` value was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ParseDevicesError {
    #[error("--devices all: libtorch sees no CUDA device")]
    NoCuda,
    #[error("`{0}` is not a device: use all, cpu, or CUDA indices such as 0,1")]
    Invalid(String),
}

/// `all` (every CUDA device libtorch sees) or a comma-separated list of indices (`0,1`), or `cpu`.
pub fn parse_devices(spec: &str) -> Result<Vec<Device>, ParseDevicesError> {
    match spec.trim() {
        "all" => {
            let n = tch::Cuda::device_count();
            if n <= 0 {
                return Err(ParseDevicesError::NoCuda);
            }
            Ok((0..n as usize).map(Device::Cuda).collect())
        }
        "cpu" => Ok(vec![Device::Cpu]),
        list => list
            .split(',')
            .map(|p| {
                let p = p.trim();
                p.parse::<usize>().map(Device::Cuda).or_else(|_| p.parse::<Device>()).map_err(|_| ParseDevicesError::Invalid(p.to_string()))
            })
            .collect(),
    }
}
