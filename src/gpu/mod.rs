//! The accelerator as NVML sees it: name, total memory, memory held by other processes. On CPU,
//! the host's memory from /proc/meminfo plays the same role.
//!
//! NVML (`libnvidia-ml.so.1`) is loaded at run time: when it is absent every reading is an error
//! or `None`, never a crash.
//!
//! Neighbours: `batch::memory` sizes batches from [`MemoryInfo`]; per-batch GPU metrics build on
//! this module; `model` asks it for the GPU's architecture and the host's memory readings. It
//! reads libtorch's allocator through `torch_shim`, and names nothing of `model`.

pub mod sampler;

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;

use crate::device::Device;
use crate::torch_shim as shim;

/// Errors reading device information.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GpuError {
    #[error("NVML is not available (is the NVIDIA driver's libnvidia-ml.so.1 on the library path?)")]
    NvmlUnavailable(#[source] nvml_wrapper::error::NvmlError),
    #[error("NVML query failed: {what}")]
    Nvml { what: &'static str, source: nvml_wrapper::error::NvmlError },
    #[error("cannot read /proc/meminfo")]
    Meminfo,
}

/// Memory of the device a worker runs on.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryInfo {
    /// GPU name as NVML reports it (matched against calibration profiles and prices), or "cpu".
    pub name: String,
    pub total_bytes: u64,
    /// Held by processes other than this one (other workers, other users).
    pub used_by_others_bytes: u64,
}

/// Memory information of `device`.
pub fn memory_info(device: Device) -> Result<MemoryInfo, GpuError> {
    match device {
        Device::Cpu => host_memory(),
        Device::Cuda(index) => match nvml_memory(index) {
            Ok(info) => Ok(info),
            // Without NVML, libtorch still knows free and total memory.
            Err(e) => match cuda_device_memory(index) {
                Some((free, total, reserved)) => Ok(MemoryInfo {
                    name: format!("cuda:{index}"),
                    total_bytes: total,
                    used_by_others_bytes: total.saturating_sub(free).saturating_sub(reserved),
                }),
                None => Err(e),
            },
        },
    }
}

/// CUDA device `index`'s compute capability (major, minor), from NVML. Blocking.
pub fn compute_capability(index: usize) -> Result<(i32, i32), GpuError> {
    let nvml = Nvml::init().map_err(GpuError::NvmlUnavailable)?;
    let dev = nvml.device_by_index(index as u32).map_err(|source| GpuError::Nvml { what: "device_by_index", source })?;
    let cc = dev.cuda_compute_capability().map_err(|source| GpuError::Nvml { what: "cuda_compute_capability", source })?;
    Ok((cc.major, cc.minor))
}

fn nvml_memory(index: usize) -> Result<MemoryInfo, GpuError> {
    let nvml = Nvml::init().map_err(GpuError::NvmlUnavailable)?;
    let dev = nvml.device_by_index(index as u32).map_err(|source| GpuError::Nvml { what: "device_by_index", source })?;
    let name = dev.name().map_err(|source| GpuError::Nvml { what: "name", source })?;
    let mem = dev.memory_info().map_err(|source| GpuError::Nvml { what: "memory_info", source })?;
    let me = std::process::id();
    let mut others: u64 = 0;
    let mut mine: u64 = 0;
    for p in dev.running_compute_processes().unwrap_or_default() {
        let used = match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => b,
            UsedGpuMemory::Unavailable => 0,
        };
        if p.pid == me {
            mine += used;
        } else {
            others += used;
        }
    }
    // Some drivers (containers) do not report per-process usage: count all used memory that is
    // not ours (our caching allocator's reservation) as others'.
    if others == 0 && mine == 0 {
        let ours = cuda_device_memory(index).map(|(_, _, reserved)| reserved).unwrap_or(0);
        others = mem.used.saturating_sub(ours).saturating_sub(reserved_by_driver(mem.total));
    }
    Ok(MemoryInfo { name, total_bytes: mem.total, used_by_others_bytes: others })
}

/// NVML counts a few hundred MB as used on an idle GPU (driver reservations): not another process.
fn reserved_by_driver(total: u64) -> u64 {
    (total / 100).min(1 << 30)
}

/// The host's memory: total, and what is unavailable to us and not ours.
pub fn host_memory() -> Result<MemoryInfo, GpuError> {
    let text = std::fs::read_to_string("/proc/meminfo").map_err(|_| GpuError::Meminfo)?;
    let field = |name: &str| -> Option<u64> {
        text.lines().find(|l| l.starts_with(name))?.split_whitespace().nth(1)?.parse::<u64>().ok().map(|k| k * 1024)
    };
    let total = field("MemTotal:").ok_or(GpuError::Meminfo)?;
    let available = field("MemAvailable:").ok_or(GpuError::Meminfo)?;
    let mine = proc_status_kib("VmRSS:").unwrap_or(0) * 1024;
    Ok(MemoryInfo {
        name: "cpu".to_string(),
        total_bytes: total,
        used_by_others_bytes: total.saturating_sub(available).saturating_sub(mine),
    })
}

/// Memory of CUDA device `index` as libtorch sees it: (free, total, reserved by this process's
/// caching allocator). `None` without CUDA.
pub fn cuda_device_memory(index: usize) -> Option<(u64, u64, u64)> {
    let (free, total) = shim::cuda_mem_info(index)?;
    let reserved = shim::cuda_memory_stat(index, shim::CudaStat::Reserved).unwrap_or(0);
    Some((free, total, reserved))
}

/// A `kB` field of /proc/self/status.
pub fn proc_status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_memory_is_read_and_nvml_absence_is_an_error_not_a_crash() {
        let h = memory_info(Device::Cpu).unwrap();
        assert_eq!(h.name, "cpu");
        assert!(h.total_bytes > 0 && h.used_by_others_bytes < h.total_bytes);
        // This machine has no NVIDIA driver: NVML must fail cleanly.
        if std::path::Path::new("/dev/nvidiactl").exists() {
            return;
        }
        assert!(matches!(memory_info(Device::Cuda(0)), Err(GpuError::NvmlUnavailable(_))));
    }
}
