//! Per-batch GPU metrics: a background thread reads NVML every `interval` (~50–100 ms) while a
//! batch runs and summarises the window: utilisation mean/max, device memory used max, power
//! mean, energy (the total-energy counter's delta, or power × time where the counter is not
//! supported), temperature max, SM clock mean, and this process's device memory.
//!
//! Without a GPU or without NVML [`GpuSampler::start`] returns `None` and the batch's GPU columns
//! stay NULL. The thread ends by itself when the sampler is dropped (nothing joins it).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;

use crate::device::Device;

/// One batch's GPU figures. Fields NVML could not read are `None`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuStats {
    pub name: String,
    pub samples: u32,
    pub util_mean: Option<f32>,
    pub util_max: Option<f32>,
    pub mem_used_max_bytes: Option<u64>,
    pub power_mean_w: Option<f32>,
    pub energy_j: Option<f64>,
    pub temp_max_c: Option<f32>,
    pub sm_clock_mean_mhz: Option<f32>,
    pub process_mem_max_bytes: Option<u64>,
}

#[derive(Default)]
struct Window {
    started: Option<Instant>,
    samples: u32,
    util: Vec<u32>,
    mem_used_max: Option<u64>,
    power_mw: Vec<u32>,
    temp_max: Option<u32>,
    sm_clock: Vec<u32>,
    proc_mem_max: Option<u64>,
    energy_start_mj: Option<u64>,
}

/// Samples one GPU on its own thread; [`GpuSampler::begin`] / [`GpuSampler::end`] bracket a
/// batch. Every NVML call happens on that thread: `begin` sends a message and `end` awaits the
/// summary, so async code never blocks on NVML.
pub struct GpuSampler {
    name: String,
    commands: mpsc::Sender<Command>,
}

enum Command {
    Begin,
    End(oneshot::Sender<GpuStats>),
}

fn sample(nvml: &Nvml, index: u32, w: &mut Window) {
    let Ok(dev) = nvml.device_by_index(index) else { return };
    w.samples += 1;
    if let Ok(u) = dev.utilization_rates() {
        w.util.push(u.gpu);
    }
    if let Ok(m) = dev.memory_info() {
        w.mem_used_max = Some(w.mem_used_max.unwrap_or(0).max(m.used));
    }
    if let Ok(p) = dev.power_usage() {
        w.power_mw.push(p);
    }
    if let Ok(t) = dev.temperature(TemperatureSensor::Gpu) {
        w.temp_max = Some(w.temp_max.unwrap_or(0).max(t));
    }
    if let Ok(c) = dev.clock_info(Clock::SM) {
        w.sm_clock.push(c);
    }
    let me = std::process::id();
    if let Ok(procs) = dev.running_compute_processes() {
        for p in procs.into_iter().filter(|p| p.pid == me) {
            if let UsedGpuMemory::Used(b) = p.used_gpu_memory {
                w.proc_mem_max = Some(w.proc_mem_max.unwrap_or(0).max(b));
            }
        }
    }
}

fn mean(v: &[u32]) -> Option<f32> {
    (!v.is_empty()).then(|| v.iter().map(|&x| x as f64).sum::<f64>() as f32 / v.len() as f32)
}

fn energy_mj(nvml: &Nvml, index: u32) -> Option<u64> {
    nvml.device_by_index(index).ok()?.total_energy_consumption().ok()
}

/// Closes a window (one last sample) and summarises it.
fn summarise(nvml: &Nvml, index: u32, name: &str, w: &mut Window) -> GpuStats {
    let energy_end = energy_mj(nvml, index);
    sample(nvml, index, w);
    let elapsed = w.started.map(|s| s.elapsed()).unwrap_or_default();
    let power_mean_w = mean(&w.power_mw).map(|mw| mw / 1000.0);
    let energy_j = match (w.energy_start_mj, energy_end) {
        (Some(a), Some(b)) if b >= a => Some((b - a) as f64 / 1000.0),
        _ => power_mean_w.map(|p| f64::from(p) * elapsed.as_secs_f64()),
    };
    let stats = GpuStats {
        name: name.to_string(),
        samples: w.samples,
        util_mean: mean(&w.util),
        util_max: w.util.iter().max().map(|&u| u as f32),
        mem_used_max_bytes: w.mem_used_max,
        power_mean_w,
        energy_j,
        temp_max_c: w.temp_max.map(|t| t as f32),
        sm_clock_mean_mhz: mean(&w.sm_clock),
        process_mem_max_bytes: w.proc_mem_max,
    };
    *w = Window::default();
    stats
}

/// The sampler thread: samples while a window is open, until every handle is dropped.
fn run(nvml: Nvml, index: u32, name: String, interval: Duration, commands: mpsc::Receiver<Command>) {
    let mut w = Window::default();
    loop {
        match commands.recv_timeout(interval) {
            Ok(Command::Begin) => {
                w = Window { started: Some(Instant::now()), energy_start_mj: energy_mj(&nvml, index), ..Window::default() };
                sample(&nvml, index, &mut w);
            }
            Ok(Command::End(reply)) => {
                let _ = reply.send(summarise(&nvml, index, &name, &mut w));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if w.started.is_some() {
                    sample(&nvml, index, &mut w);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
}

impl GpuSampler {
    /// Starts sampling `device` every `interval`; `None` on CPU or when NVML is unavailable.
    /// Loads NVML: call it off the async runtime.
    pub fn start(device: Device, interval: Duration) -> Option<GpuSampler> {
        let Device::Cuda(index) = device else { return None };
        let nvml = match Nvml::init() {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "NVML unavailable: per-batch GPU metrics will be empty");
                return None;
            }
        };
        let index = index as u32;
        let name = nvml.device_by_index(index).and_then(|d| d.name()).ok()?;
        let (commands, rx) = mpsc::channel();
        let thread_name = name.clone();
        std::thread::Builder::new().name("voxbatch-nvml".into()).spawn(move || run(nvml, index, thread_name, interval, rx)).ok()?;
        Some(GpuSampler { name, commands })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Opens a measurement window (the thread takes one sample at once). Never blocks.
    pub fn begin(&self) {
        let _ = self.commands.send(Command::Begin);
    }

    /// Closes the window and returns its summary (empty when the thread is gone).
    pub async fn end(&self) -> GpuStats {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(Command::End(tx)).is_err() {
            return GpuStats { name: self.name.clone(), ..GpuStats::default() };
        }
        rx.await.unwrap_or_else(|_| GpuStats { name: self.name.clone(), ..GpuStats::default() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_gpu_or_no_nvml_means_no_sampler_and_no_failure() {
        assert!(GpuSampler::start(Device::Cpu, Duration::from_millis(50)).is_none());
        if !std::path::Path::new("/dev/nvidiactl").exists() {
            assert!(GpuSampler::start(Device::Cuda(0), Duration::from_millis(50)).is_none());
        }
    }
}
