//! The reference C codec libraries — LAME for MP3, libopus for Opus — opened at run time from
//! the host's shared libraries (Debian's `libmp3lame0` and `libopus0`; `scripts/bootstrap.sh`
//! installs them) instead of being linked: a host without them still runs every other format and
//! says which it cannot write (`ffmpeg` depends on both, so most hosts have them).
//!
//! Neighbours: `mp3` and `opus` declare the functions they call and open their library here, once
//! per process.

use std::sync::OnceLock;

/// A codec library that could not be opened, or lacks a function this build calls.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{library} could not be loaded ({reason}); install Debian's {package} (scripts/bootstrap.sh does)")]
pub struct CodecUnavailable {
    pub library: &'static str,
    pub package: &'static str,
    pub reason: String,
}

/// An opened library, kept for the life of the process (its functions are copied out as plain
/// function pointers, valid while it stays loaded).
pub struct CodecLibrary {
    library: libloading::Library,
    name: &'static str,
    package: &'static str,
}

impl CodecLibrary {
    /// Opens the first of `sonames` that loads.
    pub fn open(sonames: &[&'static str], package: &'static str) -> Result<CodecLibrary, CodecUnavailable> {
        let mut reasons = Vec::new();
        for &soname in sonames {
            // SAFETY: these are the codecs' own shared libraries, whose initialisers have no
            // preconditions.
            match unsafe { libloading::Library::new(soname) } {
                Ok(library) => return Ok(CodecLibrary { library, name: sonames[0], package }),
                Err(e) => reasons.push(format!("{soname}: {e}")),
            }
        }
        Err(CodecUnavailable { library: sonames[0], package, reason: reasons.join("; ") })
    }

    /// The function `name` as a function pointer of type `F` (which must be its C signature).
    ///
    /// # Safety
    /// `F` must be the exact C signature of `name` in the library's ABI.
    pub unsafe fn function<F: Copy>(&self, name: &str) -> Result<F, CodecUnavailable> {
        let symbol: libloading::Symbol<'_, F> = self.library.get(name.as_bytes()).map_err(|e| CodecUnavailable {
            library: self.name,
            package: self.package,
            reason: format!("no function {name}: {e}"),
        })?;
        Ok(*symbol)
    }
}

/// Opens a codec's function table once per process: the first call tries, later calls get the
/// same table (or the same reason it is missing).
pub fn once<T>(cell: &'static OnceLock<Result<T, CodecUnavailable>>, open: impl FnOnce() -> Result<T, CodecUnavailable>) -> Result<&'static T, CodecUnavailable> {
    cell.get_or_init(open).as_ref().map_err(Clone::clone)
}
