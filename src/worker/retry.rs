//! Retrying with back-off: the one helper every stage (and `enqueue`'s publishing) uses.
//!
//! [`backoff`] is exponential with jitter; [`Retry::run`] retries an operation while the batch's
//! messages stay held, and gives up after `worker.max_hold` (so a message is never held into
//! RabbitMQ's consumer timeout) or a few attempts after the worker began stopping. A permanent
//! error (one that retrying cannot fix, e.g. refused credentials) ends the retrying at once.
//!
//! Neighbours: `intake` (reconnecting), `infer` (claims), `commit` (uploads, records),
//! `delivery` (dead-lettering), `commands::enqueue` (publishing).

use std::future::Future;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// Exponential back-off with jitter: `min × 2^attempt`, capped at `max`, times a factor in [0.5, 1).
pub fn backoff(attempt: u32, min: Duration, max: Duration) -> Duration {
    let base = min.as_secs_f64() * 2f64.powi(attempt.min(30) as i32);
    let capped = base.min(max.as_secs_f64());
    Duration::from_secs_f64(capped * (0.5 + rand::random::<f64>() * 0.5))
}

pub use crate::transience::Transience;

/// What to check when `e` is an error waiting will not fix (refused credentials or access).
pub fn permanent_hint(e: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    if let Some(e) = e.downcast_ref::<crate::storage::StorageError>() {
        return e.is_permanent().then_some(
            "S3 refused the request: check storage.access_key_id / storage.secret_access_key (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY), the bucket name and its policy",
        );
    }
    if let Some(e) = e.downcast_ref::<crate::queue::QueueError>() {
        return e.is_permanent().then_some("RabbitMQ refused the connection: check the user, password and vhost in amqp.url (AMQP_URL)");
    }
    if let Some(e) = e.downcast_ref::<crate::db::DbError>() {
        return e.is_permanent().then_some("Postgres refused the connection: check the user and password in database.url (DATABASE_URL)");
    }
    None
}

/// A permanent error that stops the whole worker: the first one raised is kept, with what to
/// check.
#[derive(Debug, Default)]
pub struct Fatal {
    token: CancellationToken,
    error: std::sync::OnceLock<(String, Option<&'static str>)>,
}

impl Fatal {
    /// Stops the worker on `error` (described as `what: error chain`).
    pub fn raise(&self, what: &str, error: &(dyn std::error::Error + 'static)) {
        let _ = self.error.set((format!("{what}: {}", crate::worker::error_chain(error)), permanent_hint(error)));
        self.token.cancel();
    }
    /// Resolves once a permanent error was raised.
    pub async fn raised(&self) {
        self.token.cancelled().await
    }
    /// The error and what to check.
    pub fn error(&self) -> Option<(&str, Option<&'static str>)> {
        self.error.get().map(|(e, h)| (e.as_str(), *h))
    }
}

/// How long and how often a stage retries while it holds messages.
#[derive(Clone, Debug)]
pub struct Retry {
    pub min: Duration,
    pub max: Duration,
    /// Give up after retrying this long (the consumer-timeout guard).
    pub max_hold: Duration,
    /// Once cancelled, give up after a few more attempts.
    pub stop: CancellationToken,
    /// Where a permanent error is reported (it stops the worker).
    pub fatal: std::sync::Arc<Fatal>,
}

/// Attempts allowed once the worker is stopping.
const ATTEMPTS_AFTER_STOP: u32 = 3;

impl Retry {
    /// Runs `f` until it succeeds; returns the last error when giving up (the caller then gives
    /// back what it holds).
    pub async fn run<T, E, F, Fut>(&self, what: &'static str, mut f: F) -> Result<T, E>
    where
        E: std::error::Error + Transience + 'static,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut attempt = 0u32;
        let mut after_stop = 0u32;
        let started = Instant::now();
        loop {
            let e = match f().await {
                Ok(v) => {
                    if attempt > 0 {
                        info!(what, attempts = attempt + 1, "succeeded after retrying");
                    }
                    return Ok(v);
                }
                Err(e) => e,
            };
            if e.is_permanent() {
                error!(what, error = %e, "permanent error: not retrying; the worker stops");
                self.fatal.raise(what, &e);
                return Err(e);
            }
            if started.elapsed() >= self.max_hold {
                error!(what, error = %e, held_s = started.elapsed().as_secs(), "giving up for now: messages go back to the queue (consumer-timeout guard)");
                return Err(e);
            }
            if self.stop.is_cancelled() {
                after_stop += 1;
                if after_stop > ATTEMPTS_AFTER_STOP {
                    error!(what, error = %e, "giving up: the worker is stopping; messages go back to the queue");
                    return Err(e);
                }
            }
            let wait = backoff(attempt, self.min, self.max);
            warn!(what, error = %e, attempt = attempt + 1, retry_in_ms = wait.as_millis() as u64, "will retry");
            attempt += 1;
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Flaky(bool);
    impl std::error::Error for Flaky {}
    impl std::fmt::Display for Flaky {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(if self.0 { "permanent" } else { "transient" })
        }
    }
    impl Transience for Flaky {
        fn is_permanent(&self) -> bool {
            self.0
        }
    }

    fn quick() -> Retry {
        Retry {
            min: Duration::from_millis(1),
            max: Duration::from_millis(2),
            max_hold: Duration::from_secs(5),
            stop: CancellationToken::new(),
            fatal: Default::default(),
        }
    }

    #[test]
    fn backoff_grows_and_stays_under_its_cap() {
        let (min, max) = (Duration::from_millis(100), Duration::from_secs(2));
        assert!(backoff(0, min, max) <= min);
        assert!(backoff(3, min, max) >= Duration::from_millis(400));
        for a in 0..40 {
            assert!(backoff(a, min, max) <= max);
        }
    }

    #[tokio::test]
    async fn transient_errors_are_retried_until_success() {
        let mut n = 0;
        let r: Result<u32, Flaky> = quick()
            .run("t", || {
                n += 1;
                let fail = n < 4;
                async move { if fail { Err(Flaky(false)) } else { Ok(n) } }
            })
            .await;
        assert_eq!(r.unwrap(), 4);
    }

    #[tokio::test]
    async fn a_permanent_error_is_returned_at_once_and_stops_the_worker() {
        let mut n = 0;
        let retry = quick();
        let r: Result<(), Flaky> = retry
            .run("t", || {
                n += 1;
                async { Err(Flaky(true)) }
            })
            .await;
        assert!(r.is_err());
        assert_eq!(n, 1);
        assert_eq!(retry.fatal.error(), Some(("t: permanent", None)));
    }

    #[tokio::test]
    async fn retrying_stops_after_the_hold_limit() {
        let retry = Retry { max_hold: Duration::from_millis(30), ..quick() };
        let started = Instant::now();
        let r: Result<(), Flaky> = retry.run("t", || async { Err(Flaky(false)) }).await;
        assert!(r.is_err());
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
