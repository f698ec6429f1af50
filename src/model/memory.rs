//! Measuring a forward pass's peak memory: the CUDA caching allocator's peak allocated bytes
//! (reset before each forward, through the libtorch shim), or on CPU the process's peak resident
//! set (VmHWM, reset through /proc/self/clear_refs).

use super::shim;
use super::Device;
use crate::gpu::proc_status_kib;

/// Peak-memory probe for one device, used on the inference thread.
#[derive(Debug, Clone, Copy)]
pub struct MemoryProbe {
    device: Device,
}

impl MemoryProbe {
    pub fn new(device: Device) -> MemoryProbe {
        MemoryProbe { device }
    }

    /// Starts a new measurement window.
    pub fn reset(&self) {
        match self.device {
            Device::Cuda(n) => shim::cuda_reset_peak(n),
            Device::Cpu => {
                // Give freed heap back first, so the window starts from what is really in use.
                // SAFETY: glibc's malloc_trim only releases free memory.
                unsafe { libc::malloc_trim(0) };
                // "5" resets the peak RSS (VmHWM) to the current RSS (Linux >= 4.0).
                let _ = std::fs::write("/proc/self/clear_refs", "5");
            }
        }
    }

    /// Peak bytes since [`MemoryProbe::reset`]: allocated by libtorch on CUDA, resident on CPU.
    pub fn peak(&self) -> Option<u64> {
        match self.device {
            Device::Cuda(n) => shim::cuda_memory_stat(n, shim::CudaStat::PeakAllocated),
            Device::Cpu => proc_status_kib("VmHWM:").map(|k| k * 1024),
        }
    }

    /// Bytes held right now (allocated on CUDA, resident on CPU).
    pub fn current(&self) -> Option<u64> {
        match self.device {
            Device::Cuda(n) => shim::cuda_memory_stat(n, shim::CudaStat::Allocated),
            Device::Cpu => proc_status_kib("VmRSS:").map(|k| k * 1024),
        }
    }

    /// Returns cached blocks to the driver (after an out-of-memory error).
    pub fn release_cached(&self) {
        if let Device::Cuda(_) = self.device {
            shim::cuda_empty_cache();
        }
    }
}

/// The caching allocator's counts on `device` since the process began: (allocations retried after
/// every cached block was freed, cudaMalloc calls, cudaFree calls). Zeros on a CPU.
pub fn allocator_counts(device: Device) -> [u64; 3] {
    match device {
        Device::Cuda(n) => [shim::CudaStat::AllocRetries, shim::CudaStat::DeviceAllocs, shim::CudaStat::DeviceFrees].map(|s| shim::cuda_memory_stat(n, s).unwrap_or(0)),
        Device::Cpu => [0; 3],
    }
}

/// [`allocator_counts`] now less `before`.
pub fn allocator_delta(device: Device, before: [u64; 3]) -> [u64; 3] {
    let now = allocator_counts(device);
    [0, 1, 2].map(|i| now[i].saturating_sub(before[i]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set in the child process that [`cpu_peak_rss_grows_with_an_allocation_and_resets`] starts.
    const ALONE: &str = "VOXBATCH_MEMORY_PROBE_ALONE";

    /// The peak resident set is the whole process's: other tests running beside this one in
    /// libtest's threads allocate and free under it (a 64-MiB allocation once read as +55 MB,
    /// CI of 2026-12-07). So the measurement runs in a process of its own: this test starts its
    /// own binary again with only itself selected, and that child measures.
    #[test]
    fn cpu_peak_rss_grows_with_an_allocation_and_resets() {
        if std::env::var_os(ALONE).is_none() {
            let name = "model::memory::tests::cpu_peak_rss_grows_with_an_allocation_and_resets";
            let exe = std::env::current_exe().expect("the test binary's path");
            let out = std::process::Command::new(exe)
                .args([name, "--exact", "--test-threads", "1", "--nocapture"])
                .env(ALONE, "1")
                .output()
                .expect("the test binary starts again");
            let log = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "the measuring child failed:\n{log}");
            assert!(log.contains("1 passed"), "the child ran no test:\n{log}");
            return;
        }
        let p = MemoryProbe::new(Device::Cpu);
        p.reset();
        let before = p.peak().unwrap();
        let big = vec![1u8; 64 << 20];
        std::hint::black_box(&big);
        let during = p.peak().unwrap();
        assert!(during >= before + (60 << 20), "{before} -> {during}");
        drop(big);
        p.reset();
        assert!(p.peak().unwrap() < during);
    }
}
