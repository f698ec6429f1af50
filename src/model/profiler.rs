//! Where device time goes, kernel by kernel: libtorch's Kineto profiler through the shim
//! (`csrc/profiler.cpp`), for `voxbatch bench token2wav --profile` — no Python or Nsight needed on
//! the GPU host. [`profile`] runs a closure between start and stop and returns each event name's
//! count and time: CUDA kernels (GPU time, where CUPTI is available) and copies on a GPU, CPU
//! operators on a CPU, each sorted into a [`category`] (attention, matmul, convolution, fused
//! element-wise, copies, other). GPU kernels do not nest, so their times add up to the device's
//! busy time; CPU operators do (a call's time includes its callees'), so on a CPU the table says
//! which operators ran, not a split of the time.
//!
//! [`Profiling`] is the same in two halves, for work whose result must outlive a profile's failure:
//! an inference thread's batch (`handle`, `[model] profile_batch`), with the device's busy time by
//! CUDA stream beside the table ([`StreamsBusy`]: what the LLM's decode and token2wav ran at once).
//!
//! Neighbours: `shim` (the error buffer convention), `bench::token2wav` and `handle` (its callers).

use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};

use super::shim::{checked, ShimError};
use super::Device;

extern "C" {
    fn voxbatch_profiler_start(cuda: i32, err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_profiler_stop(path: *const c_char, err: *mut c_char, err_len: usize) -> i32;
}

/// Errors of a profile.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProfileError {
    #[error(transparent)]
    Shim(#[from] ShimError),
    #[error("the profile's table {path}: {source}")]
    Table { path: String, source: std::io::Error },
    #[error("the profiled work failed: {0}")]
    Work(String),
}

/// One event name's total over the profile.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProfileRow {
    /// `cuda` or `cpu`.
    pub device: &'static str,
    pub name: String,
    pub category: &'static str,
    pub count: u64,
    pub seconds: f64,
}

/// Runs `work` under the profiler and returns its result and the events by total time, longest
/// first (the device's events: on a GPU its kernels and copies — or its CPU operators where no
/// kernel was recorded, as without CUPTI —, on a CPU the operators). The table is written to `table` (tab-separated: device, activity, count, ns, name).
pub fn profile<T, E: std::fmt::Display>(device: Device, table: &Path, work: impl FnOnce() -> Result<T, E>) -> Result<(T, Vec<ProfileRow>), ProfileError> {
    let profiling = Profiling::start(device, table)?;
    let result = work();
    let (rows, _) = profiling.finish()?;
    let out = result.map_err(|e| ProfileError::Work(e.to_string()))?;
    Ok((out, rows))
}

/// A profile under way: [`Profiling::start`] before the work, [`Profiling::finish`] after it — for
/// work whose result must survive the profile's failure (a worker's batch, `model::handle`). One
/// at a time per process: a second start fails.
#[must_use = "finish the profile"]
pub struct Profiling {
    device: Device,
    table: PathBuf,
    c_table: CString,
}

impl Profiling {
    /// Starts libtorch's profiler (CUDA kernels on a GPU, CPU operators); [`Profiling::finish`]
    /// writes to `table`.
    pub fn start(device: Device, table: &Path) -> Result<Profiling, ProfileError> {
        let c_table = CString::new(table.to_string_lossy().as_bytes())
            .map_err(|e| ProfileError::Table { path: table.display().to_string(), source: std::io::Error::other(e) })?;
        let cuda = matches!(device, Device::Cuda(_));
        // SAFETY: starts libtorch's profiler for this process; exceptions are caught in C++.
        checked("profiler start", |err, len| unsafe { voxbatch_profiler_start(i32::from(cuda), err, len) })?;
        Ok(Profiling { device, table: table.to_path_buf(), c_table })
    }

    /// Where [`Profiling::finish`] writes the table.
    pub fn table(&self) -> &Path {
        &self.table
    }

    /// Waits for the device, stops the profiler and writes its table, the CUDA events by stream
    /// to `<table>.streams` and their 100-ms bins to `<table>.timeline` (csrc/profiler.cpp);
    /// returns the rows (as [`profile`]) and the streams' summary.
    pub fn finish(self) -> Result<(Vec<ProfileRow>, StreamsBusy), ProfileError> {
        if let Device::Cuda(n) = self.device {
            tch::Cuda::synchronize(n as i64);
        }
        // SAFETY: stops the profiler `start` started and writes its files to a NUL-terminated path.
        checked("profiler stop", |err, len| unsafe { voxbatch_profiler_stop(self.c_table.as_ptr(), err, len) })?;
        let read = |path: &Path| std::fs::read_to_string(path).map_err(|source| ProfileError::Table { path: path.display().to_string(), source });
        let text = read(&self.table)?;
        let cuda = matches!(self.device, Device::Cuda(_));
        // Without CUPTI a GPU profile has no kernel events: then its operators say at least which ran.
        let device_rows = rows(&text, cuda);
        let rows = if device_rows.is_empty() && cuda { rows(&text, false) } else { device_rows };
        let streams = StreamsBusy::parse(&read(&PathBuf::from(format!("{}.streams", self.table.display())))?);
        Ok((rows, streams))
    }
}

/// The device's busy time over a profile, by CUDA stream (`table.streams`): what each stream ran
/// and the union over them — the streams' sum less the union is the time they overlapped.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct StreamsBusy {
    /// (stream id, events, busy seconds), by stream id.
    pub streams: Vec<(i64, u64, f64)>,
    /// Seconds at least one stream was busy.
    pub busy_seconds: f64,
    /// From the first event's start to the last one's end.
    pub span_seconds: f64,
}

impl StreamsBusy {
    fn parse(text: &str) -> StreamsBusy {
        let mut out = StreamsBusy::default();
        for line in text.lines() {
            let f: Vec<&str> = line.split('\t').collect();
            let [stream, events, busy, first, last] = f[..] else { continue };
            let (Ok(events), Ok(busy), Ok(first), Ok(last)) = (events.parse::<u64>(), busy.parse::<u64>(), first.parse::<u64>(), last.parse::<u64>()) else {
                continue;
            };
            if stream == "all" {
                out.busy_seconds = busy as f64 * 1e-9;
                out.span_seconds = last.saturating_sub(first) as f64 * 1e-9;
            } else if let Ok(id) = stream.parse::<i64>() {
                out.streams.push((id, events, busy as f64 * 1e-9));
            }
        }
        out
    }

    /// Seconds two or more streams ran at once.
    pub fn overlap_seconds(&self) -> f64 {
        (self.streams.iter().map(|s| s.2).sum::<f64>() - self.busy_seconds).max(0.0)
    }
}

/// c10's DeviceType of CUDA.
const CUDA_DEVICE: &str = "1";

/// The table's rows, the device's (CUDA events on a GPU) by total time, longest first.
fn rows(table: &str, cuda: bool) -> Vec<ProfileRow> {
    let mut rows: Vec<ProfileRow> = table
        .lines()
        .filter_map(|line| {
            let mut f = line.splitn(5, '\t');
            let (device, _activity, count, ns, name) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
            if (device == CUDA_DEVICE) != cuda {
                return None;
            }
            Some(ProfileRow {
                device: if cuda { "cuda" } else { "cpu" },
                category: category(name),
                name: name.to_string(),
                count: count.parse().ok()?,
                seconds: ns.parse::<u64>().ok()? as f64 * 1e-9,
            })
        })
        .collect();
    rows.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    rows
}

/// What kind of work an event is, by its name (kernel names of cuBLAS, cuDNN, FlashAttention,
/// Triton; aten operator names on a CPU).
pub fn category(name: &str) -> &'static str {
    let n = name.to_ascii_lowercase();
    if n.contains("memcpy") || n.contains("memset") {
        "copies"
    } else if n.contains("fmha") || n.contains("flash") || n.contains("attention") || n.contains("cutlassf") {
        "attention"
    } else if n.contains("triton") {
        "fused element-wise (triton)"
    } else if n.contains("conv") || n.contains("cudnn") || n.contains("winograd") || n.contains("implicit") {
        "convolution"
    } else if n.contains("gemm") || n.contains("nvjet") || n.contains("cublas") || n.contains("sm90_xmma") || n.contains("matmul") || n.contains("aten::mm") || n.contains("addmm") || n.contains("linear") {
        "matmul"
    } else {
        "other"
    }
}

/// Time per category, longest first.
pub fn by_category(rows: &[ProfileRow]) -> Vec<(&'static str, f64)> {
    let mut totals: Vec<(&'static str, f64)> = Vec::new();
    for r in rows {
        match totals.iter_mut().find(|(c, _)| *c == r.category) {
            Some((_, s)) => *s += r.seconds,
            None => totals.push((r.category, r.seconds)),
        }
    }
    totals.sort_by(|a, b| b.1.total_cmp(&a.1));
    totals
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two streams busy 3 and 2 s, 4 s of them at least one (so 1 s at once), over 5 s.
    #[test]
    fn the_streams_summary_gives_each_streams_busy_time_and_their_overlap() {
        let text = "7\t100\t3000000000\t1000\t4000001000\n13\t50\t2000000000\t2000000000\t5000001000\nall\t150\t4000000000\t1000\t5000001000\n";
        let s = StreamsBusy::parse(text);
        assert_eq!(s.streams, vec![(7, 100, 3.0), (13, 50, 2.0)]);
        assert_eq!(s.busy_seconds, 4.0);
        assert_eq!(s.span_seconds, 5.0);
        assert!((s.overlap_seconds() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_profile_lists_the_operators_the_work_ran_with_their_time() {
        let dir = std::env::temp_dir().join(format!("voxbatch-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let table = dir.join("kernels.tsv");
        let a = tch::Tensor::randn([64, 64], (tch::Kind::Float, tch::Device::Cpu));
        let (sum, rows) = profile(Device::Cpu, &table, || -> Result<f64, tch::TchError> {
            let b = a.f_matmul(&a)?.f_relu()?;
            b.f_sum(tch::Kind::Double)?.f_double_value(&[])
        })
        .unwrap();
        assert!(sum.is_finite());
        let mm = rows.iter().find(|r| r.name == "aten::matmul").unwrap_or_else(|| panic!("no aten::matmul in {rows:?}"));
        assert_eq!((mm.count, mm.category), (1, "matmul"));
        assert!(mm.seconds > 0.0 && rows.windows(2).all(|w| w[0].seconds >= w[1].seconds), "longest first");
        assert!(by_category(&rows).iter().any(|(c, s)| *c == "matmul" && *s >= mm.seconds));
        // Beside the table, the streams' summary: on a CPU no CUDA event, so `all` alone, empty.
        let streams = std::fs::read_to_string(dir.join("kernels.tsv.streams")).unwrap();
        assert_eq!(streams, "all\t0\t0\t0\t0\n");
        // A failing closure stops the profiler and says so; the next profile starts clean.
        let failed = profile(Device::Cpu, &table, || -> Result<(), String> { Err("no".into()) });
        assert!(matches!(failed, Err(ProfileError::Work(ref m)) if m == "no"), "{failed:?}");
        assert!(profile(Device::Cpu, &table, || -> Result<(), String> { Ok(()) }).is_ok());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn kernel_names_fall_into_their_categories() {
        for (name, want) in [
            ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>", "attention"),
            ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention"),
            ("triton_poi_fused__to_copy_cat_convolution_0", "fused element-wise (triton)"),
            ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
            ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", "matmul"),
            ("cudnn::ops::nchwToNhwcKernel", "convolution"),
            ("Memcpy HtoD (Pageable -> Device)", "copies"),
            ("void at::native::vectorized_elementwise_kernel<4, at::native::sin_kernel>", "other"),
        ] {
            assert_eq!(category(name), want, "{name}");
        }
    }
}
