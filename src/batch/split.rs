//! Running a batch so that one failure never sinks the others: on an out-of-memory error (or any
//! inference error) the batch is split in two and each half retried, down to single jobs. A single
//! job that fails alone is returned with its reason; nothing loops.
//!
//! Generic over the job type and the runner, so the rule is unit-tested with an injected OOM.

use std::future::Future;

/// Why an attempt failed.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptError {
    /// The device ran out of memory: a smaller batch may fit.
    OutOfMemory(String),
    /// Inference failed for another reason: splitting isolates the job that causes it.
    Failed(String),
    /// The runner itself is gone: give everything back (requeue).
    Fatal(String),
}

/// Something that happened while running a batch (recorded per batch).
#[derive(Debug, Clone, PartialEq)]
pub enum SplitEvent {
    OutOfMemory { size: usize, max_tokens: usize },
    Split { size: usize, into: (usize, usize) },
    FailedAlone { reason: String },
}

/// The result of [`run_splitting`].
#[derive(Debug)]
pub struct SplitRun<T, O> {
    pub done: Vec<(T, O)>,
    pub failed: Vec<(T, String)>,
    /// Jobs not attempted because the runner is gone.
    pub given_back: Vec<T>,
    pub events: Vec<SplitEvent>,
    /// Forward passes tried.
    pub attempts: usize,
}

/// Runs `items` with `run`, splitting on failure. `tokens` gives each item's length (for the
/// events). `run` returns one output per input, in order.
pub async fn run_splitting<T, O, F, Fut>(items: Vec<T>, tokens: impl Fn(&T) -> usize, mut run: F) -> SplitRun<T, O>
where
    F: FnMut(&[T]) -> Fut,
    Fut: Future<Output = Result<Vec<O>, AttemptError>>,
{
    let mut out = SplitRun { done: Vec::new(), failed: Vec::new(), given_back: Vec::new(), events: Vec::new(), attempts: 0 };
    let mut stack = vec![items];
    while let Some(part) = stack.pop() {
        if part.is_empty() {
            continue;
        }
        out.attempts += 1;
        match run(&part).await {
            Ok(outputs) if outputs.len() == part.len() => out.done.extend(part.into_iter().zip(outputs)),
            Ok(outputs) => {
                let reason = format!("model returned {} outputs for {} inputs", outputs.len(), part.len());
                out.failed.extend(part.into_iter().map(|t| (t, reason.clone())));
            }
            Err(AttemptError::Fatal(_)) => {
                out.given_back.extend(part);
                while let Some(rest) = stack.pop() {
                    out.given_back.extend(rest);
                }
            }
            Err(e) => {
                let oom = matches!(e, AttemptError::OutOfMemory(_));
                if oom {
                    let max_tokens = part.iter().map(&tokens).max().unwrap_or(0);
                    out.events.push(SplitEvent::OutOfMemory { size: part.len(), max_tokens });
                }
                if part.len() > 1 {
                    let mut left = part;
                    let right = left.split_off(left.len() / 2);
                    out.events.push(SplitEvent::Split { size: left.len() + right.len(), into: (left.len(), right.len()) });
                    stack.push(right);
                    stack.push(left);
                } else {
                    let reason = match e {
                        AttemptError::OutOfMemory(msg) => {
                            format!("does not fit in device memory even alone ({} tokens): {msg}", part.iter().map(&tokens).sum::<usize>())
                        }
                        AttemptError::Failed(msg) | AttemptError::Fatal(msg) => format!("synthesis failed: {msg}"),
                    };
                    out.events.push(SplitEvent::FailedAlone { reason: reason.clone() });
                    out.failed.extend(part.into_iter().map(|t| (t, reason.clone())));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runner that runs out of memory when batch × longest > 100 tokens, and fails on item 13.
    async fn runner(part: Vec<usize>) -> Result<Vec<usize>, AttemptError> {
        let max = part.iter().copied().max().unwrap_or(0);
        if part.len() * max > 100 {
            return Err(AttemptError::OutOfMemory("CUDA out of memory (injected)".into()));
        }
        if part.contains(&13) {
            return Err(AttemptError::Failed("bad input".into()));
        }
        Ok(part.iter().map(|x| x * 2).collect())
    }

    #[tokio::test]
    async fn an_oom_batch_is_split_until_it_fits_and_nothing_is_lost() {
        let items: Vec<usize> = vec![10, 20, 30, 40, 5, 6, 7, 8];
        let r = run_splitting(items.clone(), |t| *t, |part: &[usize]| runner(part.to_vec())).await;
        assert!(r.failed.is_empty());
        let mut done: Vec<usize> = r.done.iter().map(|(t, _)| *t).collect();
        done.sort();
        let mut want = items.clone();
        want.sort();
        assert_eq!(done, want, "every job done exactly once");
        assert!(r.done.iter().all(|(t, o)| *o == t * 2));
        assert!(r.events.iter().any(|e| matches!(e, SplitEvent::OutOfMemory { size: 8, max_tokens: 40 })));
        assert!(r.events.iter().any(|e| matches!(e, SplitEvent::Split { size: 8, into: (4, 4) })));
    }

    #[tokio::test]
    async fn a_job_that_cannot_fit_alone_fails_with_a_reason_and_does_not_loop() {
        let r = run_splitting(vec![1, 500, 2], |t| *t, |part: &[usize]| runner(part.to_vec())).await;
        assert_eq!(r.done.len(), 2);
        assert_eq!(r.failed.len(), 1);
        assert_eq!(r.failed[0].0, 500);
        assert!(r.failed[0].1.contains("does not fit in device memory even alone"), "{}", r.failed[0].1);
        assert!(r.attempts <= 5, "bounded attempts: {}", r.attempts);
    }

    #[tokio::test]
    async fn a_bad_job_is_isolated_from_its_batch() {
        let r = run_splitting(vec![1, 2, 13, 4], |t| *t, |part: &[usize]| runner(part.to_vec())).await;
        assert_eq!(r.done.len(), 3);
        assert_eq!(r.failed.len(), 1);
        assert!(r.failed[0].1.contains("bad input"));
    }

    #[tokio::test]
    async fn a_fatal_error_gives_everything_back() {
        let r = run_splitting(vec![1, 2, 3], |t| *t, |_part: &[usize]| async { Err::<Vec<usize>, _>(AttemptError::Fatal("gone".into())) }).await;
        assert_eq!(r.given_back.len(), 3);
        assert!(r.done.is_empty() && r.failed.is_empty());
    }
}
