//! The inference gate: for text batches, the intake forms the next batch only when the inference
//! stage has finished the one it holds.
//!
//! A text batch of a `cosyvoice2` model is minutes of work whose LLM and token2wav stages fill
//! the GPU by themselves, while the text frontend keeps preparing jobs from the queue. Formed
//! ahead (queued while the previous batch runs), the next batch holds only the jobs prepared by
//! then — at the start of a backlog a few hundred milliseconds' worth — and every later job waits
//! for the batch after it: a corpus of 2,010 jobs ran as 8 text batches where its work budget
//! allows 3 (docs/PERFORMANCE.md, 2026-12-04), and each text batch ends with a flush of
//! ill-matched token2wav buckets. Formed when the stage is idle, a batch takes everything prepared
//! while its predecessor ran; the handover costs the batch policy's choice (milliseconds), not a
//! GPU stall. Short batches (speech-token jobs, the reference model) keep one batch queued ahead:
//! there the handover would show.
//!
//! The model's load counts as the first batch in flight ([`InferenceGate::loading`]): the intake
//! and the frontend work while the model loads, and the first batch takes all they prepared.
//!
//! Neighbours: `intake` asks [`InferenceGate::is_idle`] before forming a batch and calls
//! [`InferenceGate::sent`]; `infer` calls [`InferenceGate::finished`] when the model is ready
//! and when a batch's inference is over (or it was given back unstarted).

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// Batches handed to the inference stage and not yet finished, and a wake-up for the intake.
#[derive(Debug, Default)]
pub struct InferenceGate {
    in_flight: AtomicUsize,
    idle: Notify,
}

impl InferenceGate {
    /// A gate held until the model has loaded: the load counts as a batch in flight, which the
    /// inference stage finishes once `ModelHandle::ready` resolves, so the first batch takes
    /// every job prepared during the load.
    pub fn loading() -> InferenceGate {
        InferenceGate { in_flight: AtomicUsize::new(1), idle: Notify::new() }
    }

    /// True when no batch is queued for or running in the inference stage.
    pub fn is_idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
    }

    /// The intake handed a batch over.
    pub fn sent(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// The inference stage is done with a batch (inferred, failed or given back).
    pub fn finished(&self) {
        let before = self.in_flight.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(before > 0, "finished without a batch sent");
        if before == 1 {
            // A stored permit if the intake is not waiting yet: the wake-up is never lost.
            self.idle.notify_one();
        }
    }

    /// Resolves once the stage may be idle (check [`InferenceGate::is_idle`] again).
    pub async fn idled(&self) {
        self.idle.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn the_intake_is_woken_when_the_last_batch_in_flight_finishes_even_before_it_waits() {
        let gate = Arc::new(InferenceGate::default());
        assert!(gate.is_idle());
        gate.sent();
        gate.sent();
        assert!(!gate.is_idle());
        gate.finished();
        assert!(!gate.is_idle(), "one batch still in flight");
        // Not idle: no wake-up yet.
        assert!(tokio::time::timeout(Duration::from_millis(50), gate.idled()).await.is_err());
        // Finished before anyone waits: the wake-up is kept for the next wait.
        gate.finished();
        assert!(gate.is_idle());
        tokio::time::timeout(Duration::from_secs(1), gate.idled()).await.expect("the stored wake-up");
        // Finished while the intake waits.
        gate.sent();
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.idled().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        gate.finished();
        tokio::time::timeout(Duration::from_secs(1), waiter).await.expect("woken").expect("joined");
        assert!(gate.is_idle());
    }

    #[tokio::test]
    async fn a_gate_held_for_the_load_opens_when_the_model_is_ready() {
        let gate = InferenceGate::loading();
        assert!(!gate.is_idle(), "no batch is formed while the model loads");
        assert!(tokio::time::timeout(Duration::from_millis(50), gate.idled()).await.is_err());
        gate.finished(); // the model is ready
        assert!(gate.is_idle());
        tokio::time::timeout(Duration::from_secs(1), gate.idled()).await.expect("the intake is woken");
    }
}
