//! Compiled kernels (issue 16): AOTInductor packages (`.pt2`, made by
//! `tools/compile_token2wav.py` on the machine that will run them) loaded through the C++ shim
//! (`csrc/aoti.cpp`, `torch::inductor::AOTIModelPackageLoader`) and run on tch tensors, no Python
//! at run time.
//!
//! A model directory keeps them under `compiled/<key>/<stage>.pt2`, key =
//! `<arch>-torch<version>-<precision>` (`sm90-torch2.11.0-bf16`, `cpu-torch2.11.0-fp32`): a worker
//! on another GPU, torch or precision finds none of its key and runs the eager port. A package of
//! its key is used only if its metadata agrees (stage, torch, precision, the weights' digest);
//! otherwise — or if it cannot be loaded — the eager port runs and a warning says why. Never a
//! failure: compiled kernels are an optimisation.
//!
//! Neighbours: `cosyvoice2::flow` (the estimator's Euler steps call the package), `shim` (errors).

use std::ffi::{c_char, c_void, CString};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use sha2::{Digest, Sha256};

use super::shim::{checked, ShimError};
use super::{Device, Precision};

extern "C" {
    fn voxbatch_aoti_load(path: *const c_char, device_index: i32, out: *mut *mut c_void, err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_aoti_metadata(handle: *mut c_void, key: *const c_char, value: *mut c_char, value_len: usize, err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_aoti_run(
        handle: *mut c_void,
        inputs: *mut *mut c_void,
        n_inputs: i32,
        outputs: *mut *mut c_void,
        max_outputs: i32,
        n_outputs: *mut i32,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
    fn voxbatch_aoti_free(handle: *mut c_void);
}

/// The most outputs a package may return.
const MAX_OUTPUTS: usize = 8;

/// A loaded AOTInductor package.
pub struct CompiledPackage {
    handle: NonNull<c_void>,
    pub path: PathBuf,
}

// SAFETY: the loader is created, run and freed on the thread that owns this value; moving it to
// another thread before use (the inference thread) is fine, sharing it is not (no Sync).
unsafe impl Send for CompiledPackage {}

impl CompiledPackage {
    /// Loads `path` for `device`.
    pub fn load(path: &Path, device: Device) -> Result<CompiledPackage, ShimError> {
        let c_path = CString::new(path.as_os_str().to_string_lossy().as_bytes()).map_err(|_| ShimError { call: "load package", message: "a NUL in the path".into() })?;
        let index = match device {
            Device::Cpu => -1,
            Device::Cuda(n) => n as i32,
        };
        let mut handle = std::ptr::null_mut();
        // SAFETY: `c_path` outlives the call; the shim writes a new loader into `handle` on success.
        checked("load package", |err, len| unsafe { voxbatch_aoti_load(c_path.as_ptr(), index, &mut handle, err, len) })?;
        let handle = NonNull::new(handle).ok_or_else(|| ShimError { call: "load package", message: "no handle".into() })?;
        Ok(CompiledPackage { handle, path: path.to_path_buf() })
    }

    /// The package's metadata value of `key` (empty when absent).
    pub fn metadata(&self, key: &str) -> Result<String, ShimError> {
        let c_key = CString::new(key).map_err(|_| ShimError { call: "package metadata", message: "a NUL in the key".into() })?;
        let mut value = vec![0 as c_char; 512];
        // SAFETY: a live handle; `value` is a buffer of its stated length the shim NUL-terminates.
        checked("package metadata", |err, len| unsafe {
            voxbatch_aoti_metadata(self.handle.as_ptr(), c_key.as_ptr(), value.as_mut_ptr(), value.len(), err, len)
        })?;
        // SAFETY: NUL-terminated by the shim.
        Ok(unsafe { std::ffi::CStr::from_ptr(value.as_ptr()) }.to_string_lossy().into_owned())
    }

    /// Runs the package on `inputs` (made contiguous first: the compiled kernels index them as
    /// the dense example inputs they were traced with, so an expanded view would be misread).
    pub fn run(&self, inputs: &[&tch::Tensor]) -> Result<Vec<tch::Tensor>, ShimError> {
        let dense: Vec<tch::Tensor> = inputs
            .iter()
            .map(|t| t.f_contiguous())
            .collect::<Result<_, _>>()
            .map_err(|e| ShimError { call: "run package", message: e.to_string() })?;
        let mut ptrs: Vec<*mut c_void> = dense.iter().map(|t| t.as_ptr() as *mut c_void).collect();
        let mut outs = [std::ptr::null_mut::<c_void>(); MAX_OUTPUTS];
        let mut n = 0i32;
        // SAFETY: every input is a live tch tensor (an at::Tensor*) borrowed for the call; the shim
        // writes up to MAX_OUTPUTS new heap at::Tensors and their count.
        checked("run package", |err, len| unsafe {
            voxbatch_aoti_run(self.handle.as_ptr(), ptrs.as_mut_ptr(), ptrs.len() as i32, outs.as_mut_ptr(), MAX_OUTPUTS as i32, &mut n, err, len)
        })?;
        // SAFETY: each of the first `n` pointers is an at::Tensor the shim allocated; from_ptr owns it.
        Ok(outs[..n.max(0) as usize].iter().map(|&p| unsafe { tch::Tensor::from_ptr(p.cast()) }).collect())
    }
}

impl Drop for CompiledPackage {
    fn drop(&mut self) {
        // SAFETY: the handle came from voxbatch_aoti_load and is freed once.
        unsafe { voxbatch_aoti_free(self.handle.as_ptr()) }
    }
}

/// torch's version as packages are keyed (`2.11.0`, without a local suffix).
pub fn torch_version() -> &'static str {
    // tch 0.24 pairs with torch 2.11.0 exactly (build.rs checks the libtorch it links).
    "2.11.0"
}

/// The key packages for `device` and `precision` are filed under, or why there is none (NVML
/// cannot say the GPU's architecture). Blocking (NVML).
pub fn package_key(device: Device, precision: Precision) -> Result<String, String> {
    let arch = match device {
        Device::Cpu => "cpu".to_string(),
        Device::Cuda(n) => {
            let (major, minor) = crate::gpu::compute_capability(n).map_err(|e| format!("the GPU's architecture is unknown ({e})"))?;
            format!("sm{major}{minor}")
        }
    };
    Ok(format!("{arch}-torch{}-{precision}", torch_version()))
}

/// The first 16 hex digits of `file`'s sha256: what a package's `voxbatch.weights` must say.
pub fn weights_digest(file: &Path) -> Result<String, String> {
    let mut f = std::fs::File::open(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut f, &mut hasher).map_err(|e| format!("{}: {e}", file.display()))?;
    Ok(hex::encode(hasher.finalize())[..16].to_string())
}

/// What a model directory offers for `stage` on `device` at `precision`.
pub enum PackageChoice {
    Compiled(CompiledPackage),
    /// No package of this key: eager, quietly.
    Absent { key: String },
    /// A package that cannot be used: eager, with a warning saying why.
    Unusable { path: PathBuf, reason: String },
}

/// Finds and checks `dir/compiled/<key>/<stage>.pt2` against `weights` (the file its weights
/// came from). Blocking (NVML, files).
pub fn find_package(dir: &Path, stage: &str, device: Device, precision: Precision, weights: &Path) -> PackageChoice {
    let key = match package_key(device, precision) {
        Ok(k) => k,
        Err(reason) => return PackageChoice::Unusable { path: dir.join("compiled"), reason },
    };
    let path = dir.join("compiled").join(&key).join(format!("{stage}.pt2"));
    if !path.is_file() {
        return PackageChoice::Absent { key };
    }
    let unusable = |reason: String| PackageChoice::Unusable { path: path.clone(), reason };
    let package = match CompiledPackage::load(&path, device) {
        Ok(p) => p,
        Err(e) => return unusable(format!("cannot be loaded: {e}")),
    };
    let digest = match weights_digest(weights) {
        Ok(d) => d,
        Err(e) => return unusable(e),
    };
    let expected = [("voxbatch.key", key.as_str()), ("voxbatch.stage", stage), ("voxbatch.weights", digest.as_str())];
    for (k, want) in expected {
        match package.metadata(k) {
            Ok(have) if have == want => {}
            Ok(have) => {
                return unusable(format!(
                    "its {k} is `{have}`, this model and machine need `{want}`: compile it again (tools/compile_token2wav.py)"
                ))
            }
            Err(e) => return unusable(format!("metadata: {e}")),
        }
    }
    PackageChoice::Compiled(package)
}
