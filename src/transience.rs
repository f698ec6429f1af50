//! Whether an error heals by waiting: the one trait the stages' errors implement (`db`, `queue`,
//! `storage`, `voice`) and the retry helper (`worker::retry`) reads. It sits below the stages so
//! that they need not import the worker that retries them.

/// Whether retrying an error can help.
pub trait Transience {
    /// True when the error will not go away by itself (bad credentials, access denied, a
    /// request the service will always refuse).
    fn is_permanent(&self) -> bool {
        false
    }
}
