//! Where device time goes, kernel by kernel: libtorch's Kineto profiler through the shim
//! (`csrc/profiler.cpp`), for `voxbatch bench token2wav --profile` — no Python or Nsight needed on
//! the GPU host. [`profile`] runs a closure between start and stop and returns each event name's
//! count and time: CUDA kernels (GPU time, where CUPTI is available) and copies on a GPU, CPU
//! operators on a CPU, each sorted into a [`category`] (attention, matmul, convolution, fused
//! element-wise, copies, other). GPU kernels do not nest, so their times add up to the device's
//! busy time; CPU operators do (a call's time includes its callees'), so on a CPU the table says
//! which operators ran, not a split of the time.
//!
//! Neighbours: `shim` (the error buffer convention), `bench::token2wav` (its caller).

use std::ffi::{c_char, CString};
use std::path::Path;

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
    let path = CString::new(table.to_string_lossy().as_bytes()).map_err(|e| ProfileError::Table { path: table.display().to_string(), source: std::io::Error::other(e) })?;
    let cuda = matches!(device, Device::Cuda(_));
    // SAFETY: starts libtorch's profiler for this process; exceptions are caught in C++.
    checked("profiler start", |err, len| unsafe { voxbatch_profiler_start(i32::from(cuda), err, len) })?;
    let result = work();
    if let Device::Cuda(n) = device {
        tch::Cuda::synchronize(n as i64);
    }
    // SAFETY: stops the profiler started above and writes its table to a NUL-terminated path.
    checked("profiler stop", |err, len| unsafe { voxbatch_profiler_stop(path.as_ptr(), err, len) })?;
    let out = result.map_err(|e| ProfileError::Work(e.to_string()))?;
    let text = std::fs::read_to_string(table).map_err(|source| ProfileError::Table { path: table.display().to_string(), source })?;
    // Without CUPTI a GPU profile has no kernel events: then its operators say at least which ran.
    let device_rows = rows(&text, cuda);
    Ok((out, if device_rows.is_empty() && cuda { rows(&text, false) } else { device_rows }))
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
