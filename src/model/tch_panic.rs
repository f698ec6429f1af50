//! libtorch failures that tch 0.24 raises as panics, given back as errors. tch's generated
//! operations that take a scalar (`f_mul_scalar`, `f_add_scalar`, `f_remainder`, `f_fill_`, …)
//! build a temporary `tch::Scalar` inside the call and drop it before they read libtorch's error,
//! and `Scalar`'s drop reads that pending error and unwraps it. So a CUDA out-of-memory inside
//! `x.f_mul_scalar(2.0)` panics ("called `Result::unwrap()` on an `Err` value: Torch(\"CUDA out
//! of memory …\")") where every other operation returns `Err` — seen on an H100 on 2026-12-06,
//! the eager CosyVoice3 token2wav at 256 items of 20 s: the bench's thread died, and a worker's
//! inference thread would have stopped for good. The error is read and cleared before the panic,
//! so libtorch is left as after any failed call.
//!
//! [`caught`] runs a batch and gives such a panic back as the error it carried (out of memory as
//! [`ModelError::OutOfMemory`], so the batch is split like any other); any other panic goes on
//! unwinding — a defect, not an outcome. Inside it, such a panic is not printed by Rust's panic
//! hook ("thread … panicked at …/tch-0.24.0/src/wrappers/scalar.rs", with libtorch's whole C++
//! backtrace — seen on an H100 on 2026-12-06 above the warning that it was caught): the warning
//! says it once. Every other panic is printed as before.
//!
//! Neighbours: `handle` (each batch on the inference thread), `tts::buckets` (each token2wav
//! bucket, the token2wav thread's only libtorch work, so that an out-of-memory bucket shrinks the
//! buckets as any other does),
//! `bench::token2wav` (each measured point); `torchscript::classify` sorts the error.

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Once;

use super::torchscript::classify;
use super::ModelError;

/// How `Result::unwrap` words the panic of tch's `Scalar` drop, before the error's `Debug` form.
const UNWRAPPED: &str = "called `Result::unwrap()` on an `Err` value: ";

/// `run`'s result, or the libtorch error that tch raised as a panic inside it, classified for a
/// batch of `batch_size`. Other panics resume.
pub fn caught<T>(batch_size: usize, run: impl FnOnce() -> Result<T, ModelError>) -> Result<T, ModelError> {
    quiet_hook();
    let guarded = Guarding::enter();
    let outcome = catch_unwind(AssertUnwindSafe(run));
    drop(guarded);
    match outcome {
        Ok(result) => result,
        Err(payload) => match torch_error(payload.as_ref()) {
            Some(e) => {
                tracing::warn!(error = %e, "a libtorch failure inside a scalar operation (tch raises it as a panic), returned as the error it carried");
                Err(classify(e, batch_size))
            }
            None => resume_unwind(payload),
        },
    }
}

thread_local! {
    /// How many [`caught`] calls this thread is inside.
    static GUARDING: Cell<u32> = const { Cell::new(0) };
}

/// This thread inside a [`caught`] call while it lives (left on unwinding too).
struct Guarding;

impl Guarding {
    fn enter() -> Guarding {
        GUARDING.with(|g| g.set(g.get() + 1));
        Guarding
    }
}

impl Drop for Guarding {
    fn drop(&mut self) {
        GUARDING.with(|g| g.set(g.get().saturating_sub(1)));
    }
}

/// Whether the panic hook stays silent on `payload`: a libtorch error tch raised as a panic,
/// inside [`caught`], which gives it back as an error and logs it.
fn silenced(payload: &(dyn Any + Send)) -> bool {
    GUARDING.with(Cell::get) > 0 && torch_error(payload).is_some()
}

/// Installs, once per process, a panic hook that skips [`silenced`] panics and hands every other
/// one to the hook that was there before (Rust's default, which prints it).
fn quiet_hook() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !silenced(info.payload()) {
                previous(info);
            }
        }));
    });
}

/// The libtorch error a panic's payload carries, if it is tch's unwrapped `TchError::Torch`.
fn torch_error(payload: &(dyn Any + Send)) -> Option<tch::TchError> {
    let message = payload.downcast_ref::<String>().map(String::as_str).or_else(|| payload.downcast_ref::<&str>().copied())?;
    let debug = message.strip_prefix(UNWRAPPED)?.strip_prefix("Torch(")?.strip_suffix(')')?;
    // The message as `Debug` quoted it; kept quoted if it does not parse back.
    let text = serde_json::from_str::<String>(debug).unwrap_or_else(|_| debug.to_string());
    Some(tch::TchError::Torch(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Tensor;

    /// The defect itself, on the CPU: an integer remainder by zero fails inside a scalar operation,
    /// and tch panics instead of returning the error; `caught` gives it back as an inference error.
    #[test]
    fn a_libtorch_failure_inside_a_scalar_operation_is_an_error_not_a_dead_thread() {
        let x = Tensor::from_slice(&[7i64, 8]);
        let raw = catch_unwind(AssertUnwindSafe(|| x.f_remainder(0)));
        assert!(raw.is_err(), "tch returned the error itself: this guard may go");
        let err = caught(2, || x.f_remainder(0).map_err(ModelError::Inference)).unwrap_err();
        assert!(matches!(err, ModelError::Inference(_)), "{err:?}");
        assert!(format!("{:?}", err).contains("ZeroDivisionError"), "{err:?}");
        // libtorch is usable afterwards, and a result passes through.
        let ok = caught(2, || x.f_add_scalar(1).map_err(ModelError::Inference)).unwrap();
        assert_eq!(Vec::<i64>::try_from(&ok).unwrap(), [8, 9]);
    }

    #[test]
    fn a_cuda_out_of_memory_raised_as_a_panic_is_the_batchs_out_of_memory() {
        let payload: Box<dyn Any + Send> = Box::new(format!(
            "{UNWRAPPED}Torch(\"CUDA out of memory. Tried to allocate 7.33 GiB. GPU 0 has a total capacity of 79.18 GiB\")"
        ));
        let err = caught::<()>(256, || resume_unwind(payload)).unwrap_err();
        match err {
            ModelError::OutOfMemory { batch_size, source } => {
                assert_eq!(batch_size, 256);
                assert!(source.to_string().starts_with("Internal torch error: CUDA out of memory. Tried"), "{source}");
            }
            other => panic!("{other:?}"),
        }
    }

    /// Inside `caught`, and only there, a libtorch error raised as a panic is not printed (the
    /// warning says it); any other panic is.
    #[test]
    fn the_panic_hook_is_silent_only_on_libtorch_errors_inside_caught() {
        let torch: Box<dyn Any + Send> = Box::new(format!("{UNWRAPPED}Torch(\"CUDA out of memory.\")"));
        let other: Box<dyn Any + Send> = Box::new("index out of bounds".to_string());
        assert!(!silenced(torch.as_ref()), "silenced outside caught");
        let inside = caught(1, || Ok((silenced(torch.as_ref()), silenced(other.as_ref())))).unwrap();
        assert_eq!(inside, (true, false));
        // Left on unwinding too: a panic through `caught` does not leave the thread silenced.
        let _ = catch_unwind(AssertUnwindSafe(|| caught::<()>(1, || panic!("a defect"))));
        assert!(!silenced(torch.as_ref()), "still silenced after a panic unwound through caught");
    }

    #[test]
    fn any_other_panic_goes_on_unwinding() {
        let outer = catch_unwind(|| caught::<()>(1, || panic!("a defect"))).unwrap_err();
        assert_eq!(outer.downcast_ref::<&str>(), Some(&"a defect"));
    }
}
