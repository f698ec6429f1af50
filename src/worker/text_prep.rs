//! A text job's preparation at the intake: the text frontend (normalisation, segments, tokens)
//! on the blocking pool, `[frontend] threads` jobs at a time; the prepared job comes back to the
//! intake's pool, text that says nothing is refused, a broken grammar fails the job. While it is
//! prepared, its estimated work counts as held (`Intake::hold_work`).
//!
//! Neighbours: `intake` hands it text jobs and takes them back prepared; `model::TextInput` is
//! what preparing makes; `delivery` settles what cannot be prepared.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::delivery::{Delivery, Settler};
use super::intake::Received;
use crate::frontend::{Frontend, FrontendError, SpeakingRates};
use crate::job::{Job, Rejection, RejectionKind};
use crate::model::llm::family::LmFamily;
use crate::model::TextInput;

/// How a text job is prepared: the text frontend on the blocking pool, a few jobs at a time.
#[derive(Clone)]
pub struct TextPrep {
    pub frontend: Arc<Frontend>,
    /// Whose LM the jobs are prepared for (how an instruction is written).
    pub family: LmFamily,
    /// Jobs prepared at once (blocking threads; the grammars are one lock per language).
    pub slots: Arc<tokio::sync::Semaphore>,
    /// `[frontend]` speaking rates (a text job's estimated speech tokens are its length), and
    /// `[llm] force_lengths` (benchmarks with random weights).
    pub rates: SpeakingRates,
    pub force_lengths: bool,
    /// Estimated speech tokens of the jobs the frontend is preparing now (part of the work the
    /// intake holds: `Intake::hold_work`).
    pub preparing: Arc<std::sync::atomic::AtomicUsize>,
    pub settler: Arc<Settler>,
    pub stop: CancellationToken,
    /// Where prepared jobs go (the intake's `returns`).
    pub returns: mpsc::UnboundedSender<Received>,
}

impl TextPrep {
    /// The worker's text preparation: `frontend` with `threads` jobs at once for `family`'s LM,
    /// `cfg`'s speaking rates and `[llm] force_lengths`; prepared jobs go to `returns`.
    pub(super) fn new(
        frontend: Arc<Frontend>,
        family: LmFamily,
        threads: usize,
        cfg: &crate::config::Config,
        settler: Arc<Settler>,
        stop: CancellationToken,
        returns: mpsc::UnboundedSender<Received>,
    ) -> TextPrep {
        TextPrep {
            frontend,
            family,
            slots: Arc::new(tokio::sync::Semaphore::new(threads)),
            rates: SpeakingRates::from_config(&cfg.frontend),
            force_lengths: cfg.llm.force_lengths,
            preparing: Arc::default(),
            settler,
            stop,
            returns,
        }
    }

    /// Runs the text frontend over a job on the blocking pool; the prepared job comes back
    /// through the intake's `returns` (or, when the worker is stopping, goes back to the queue).
    /// Text that says nothing (or that the tokenizer refuses) is rejected with the reason; a
    /// failure of the model's grammar files fails the job, saying so.
    pub(super) fn spawn(&self, job: Job, voice: i64, delivery: Delivery) {
        let prep = self.clone();
        // Counted as held work until prepared, at the slower (Chinese) speaking rate: an estimate
        // on the high side takes less ahead, never more.
        let estimate = self.rates.speech_tokens(&job.text, crate::frontend::segment::Lang::Zh);
        let counted = Preparing::count(&self.preparing, estimate);
        tokio::spawn(async move {
            let _counted = counted;
            let _slot = prep.slots.clone().acquire_owned().await;
            let (id, text, mode, instruction) = (job.job_id, job.text.clone(), job.mode, job.instruction.clone());
            let campaign = job.campaign.clone();
            let (frontend, family, rates, forced) = (prep.frontend.clone(), prep.family, prep.rates, prep.force_lengths);
            let result = tokio::task::spawn_blocking(move || TextInput::prepare(&frontend, family, id, &text, mode, instruction.as_deref(), &rates, forced)).await;
            let settler = &prep.settler;
            match result {
                Ok(Ok(input)) => {
                    let length = input.estimated_speech_tokens();
                    let r = Received { job, tokens: Vec::new(), voice, text: Some(Arc::new(input)), length, claim: 0, delivery };
                    if prep.stop.is_cancelled() {
                        settler.outbox.give_back(vec![r.delivery]).await;
                    } else if let Err(mpsc::error::SendError(r)) = prep.returns.send(r) {
                        settler.outbox.give_back(vec![r.delivery]).await;
                    }
                }
                Ok(Err(e)) if e.is_input() => {
                    let kind = match e {
                        FrontendError::Empty => RejectionKind::NothingToSay("it is empty or only punctuation and symbols".into()),
                        other => RejectionKind::InvalidField { field: "text", reason: other.to_string() },
                    };
                    settler.reject(Rejection { job_id: Some(id), campaign: Some(campaign), kind }, delivery).await;
                }
                Ok(Err(e)) => settler.fail(id, &format!("text frontend: {}", super::error_chain(&e)), delivery).await,
                Err(e) => settler.fail(id, &format!("text frontend stopped: {e}"), delivery).await,
            }
        });
    }
}

/// A job's estimated work counted in `TextPrep::preparing` while the frontend prepares it.
struct Preparing {
    counter: Arc<std::sync::atomic::AtomicUsize>,
    tokens: usize,
}

impl Preparing {
    fn count(counter: &Arc<std::sync::atomic::AtomicUsize>, tokens: usize) -> Preparing {
        counter.fetch_add(tokens, std::sync::atomic::Ordering::SeqCst);
        Preparing { counter: counter.clone(), tokens }
    }
}

impl Drop for Preparing {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.tokens, std::sync::atomic::Ordering::SeqCst);
    }
}

