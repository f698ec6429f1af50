//! Intake: consume deliveries, validate them into jobs, and form batches.
//!
//! Connects (reconnecting with back-off), checks each job's voice against the worker's
//! `VoiceBook` (a voice it does not know sends it to Postgres once before the job is refused, so a
//! voice added a moment ago is found), feeds each valid job to the batch policy and hands a batch
//! to the inference stage only when that stage has room (text batches: only when it is idle,
//! `gate`), so each batch is chosen from everything held at that moment. Poison is rejected at
//! once (`Settler::reject`). A text job of a `cosyvoice2` model goes through the text frontend
//! first (`text_prep`, on the blocking pool: text that says nothing is rejected there, before it
//! takes a place in a batch), and joins the policy with its estimated speech tokens (characters at
//! the speaking rate) as its length, the unit of speech-token jobs too. Jobs parked by the
//! inference stage (claimed elsewhere) and prepared text jobs come back through `returns`. On
//! shutdown or drain it stops consuming, gives back every job not started, and waits for the
//! other stages to settle what they hold before closing the connection.
//!
//! Text models pull their messages (`basic.get`, at most `prefetch` between looks at the rest of
//! the loop) only while less than the next batch's work waits (`hold_work`): the rest of the
//! backlog stays in the queue for other workers. (A consumer cancelled and renewed, the first
//! form, crashed RabbitMQ 3.10's channel on a delivery in flight at the cancel — `function_clause`
//! in `rabbit_channel:handle_deliver0` — and every held message came back.)
//!
//! Neighbours: `mod.rs` wires it; `infer` receives its batches; `gate` says when the inference
//! stage is idle; `text_prep` prepares text jobs; `delivery` settles messages; `batch` decides;
//! `job` validates.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicGetOptions, BasicQosOptions, ConfirmSelectOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, Consumer};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::delivery::{Delivery, HeldCount, Outbox, Settler};
use super::gate::InferenceGate;
pub use super::text_prep::TextPrep;
use super::retry::{backoff, Fatal, Transience};
use super::WorkerError;
use crate::batch::{BatchOutcome, BatchPolicy, Decision, Flush, Pending};
use crate::config::{AmqpConfig, Limits};
use crate::job::{parse_job, Job, Rejection, RejectionKind};
use crate::model::{model_input, ModelInput};
use crate::model::{Manifest, TextInput};
use crate::voice::{BookEntry, Lookup, VoiceBook};
use crate::queue::{self, QueueError};

/// Text models: the back-off between looks at an empty queue (doubling from the first to the last).
const PULL_BACKOFF_MIN: Duration = Duration::from_millis(50);
const PULL_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// A valid job and its delivery.
pub struct Received {
    pub job: Job,
    /// What the model takes: tokenized text or the job's speech tokens.
    pub tokens: Vec<i64>,
    /// The job's voice: its index on the model thread (`VoiceBook`).
    pub voice: i64,
    /// A text job of a `cosyvoice2` model: its segments, as the frontend prepared them.
    pub text: Option<Arc<TextInput>>,
    /// Tokens the batch policy counts (the voice's prompt included).
    pub length: usize,
    /// The claim this delivery synthesizes under, once `infer` has claimed it (0 before).
    pub claim: i32,
    pub delivery: Delivery,
}

/// A batch as assembled, with the peak memory the policy predicted for it.
pub struct Assembled {
    pub flush: Flush<Received>,
    pub predicted_peak: Option<f64>,
}

/// What the intake needs.
pub struct Intake {
    pub amqp: AmqpConfig,
    pub limits: Limits,
    pub manifest: Arc<Manifest>,
    /// The voices jobs may name (CosyVoice2: Postgres's, learned while running).
    pub voices: Arc<VoiceBook>,
    /// Kind `cosyvoice2`: how text jobs are prepared.
    pub text: Option<TextPrep>,
    pub worker_id: String,
    pub prefetch: u16,
    /// Text models: the work the intake holds for the next batch (`Sizing::hold_work`). There is no
    /// consumer: messages are pulled one `basic.get` at a time, at most `prefetch` in a row, while
    /// less than this much work waits (estimated speech tokens of the jobs unbatched or in the
    /// frontend); an empty queue is asked again after a back-off (50 ms doubling to 1 s). The
    /// rest of the backlog stays in the queue for other workers.
    pub hold_work: Option<usize>,
    /// Exit once the queue is empty and nothing is held.
    pub drain: bool,
    pub drain_poll: Duration,
    pub held: HeldCount,
    /// Cancelled when the intake stops (the other stages then give up retrying sooner).
    pub stop: CancellationToken,
    /// Raised by any stage on a permanent error: the worker stops.
    pub fatal: Arc<Fatal>,
    pub outbox: Arc<Outbox>,
    pub settler: Arc<Settler>,
}

/// The stage's channels.
pub struct IntakeChannels {
    pub batches: mpsc::Sender<Assembled>,
    pub outcomes: mpsc::UnboundedReceiver<BatchOutcome>,
    /// Jobs the inference stage parked (claimed by another delivery) and now returns, and text
    /// jobs the frontend prepared.
    pub returns: mpsc::UnboundedReceiver<Received>,
    /// Where prepared text jobs are sent (into `returns`).
    pub prepared: mpsc::UnboundedSender<Received>,
    /// Text models: a batch is formed only when the inference stage is idle (`gate`'s module doc).
    pub gate: Option<Arc<InferenceGate>>,
}

/// How a connected session ended.
enum SessionEnd {
    /// Shutdown or drained: stop.
    Stop,
    /// The channel failed or the consumer was cancelled: connect again.
    Reconnect,
}

impl Intake {
    /// Runs until `shutdown` resolves (or, with `drain`, the queue is empty).
    pub async fn run(
        self,
        mut policy: Box<dyn BatchPolicy<Received>>,
        mut ch: IntakeChannels,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), WorkerError> {
        tokio::pin!(shutdown);
        let mut seq = 0u64;
        loop {
            let connected = tokio::select! {
                c = self.connect() => c,
                _ = &mut shutdown => None,
                _ = self.fatal.raised() => None,
            };
            let Some((conn, channel, consumer)) = connected else { break };
            let end = self.session(&channel, consumer, policy.as_mut(), &mut ch, &mut seq, &mut shutdown).await?;
            match end {
                SessionEnd::Stop => {
                    self.stop_consuming(&channel, policy.as_mut(), ch.batches, &mut ch.returns).await;
                    let _ = conn.close(200, "worker stopping".into()).await;
                    return Ok(());
                }
                SessionEnd::Reconnect => {
                    // Jobs received on a dead channel cannot be acked; the broker redelivers them.
                    let lost = policy.take_all();
                    if !lost.is_empty() {
                        info!(count = lost.len(), "dropping jobs of the closed channel; the broker redelivers them");
                    }
                    let _ = conn.close(0, "reconnecting".into()).await;
                }
            }
        }
        self.stop.cancel();
        Ok(())
    }

    /// One connected session: consume and batch until it ends.
    async fn session(
        &self,
        channel: &Channel,
        consumer: Option<Consumer>,
        policy: &mut dyn BatchPolicy<Received>,
        ch: &mut IntakeChannels,
        seq: &mut u64,
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Result<SessionEnd, WorkerError> {
        let mut drain_tick = tokio::time::interval(self.drain_poll);
        let mut empty_polls = 0;
        // Kinds without `hold_work` consume; text models pull (`pull`) and have no consumer.
        let mut consumer = consumer;
        // Text models: when to ask an empty queue again, and the back-off since it was last found empty.
        let mut pull_at: Option<Instant> = None;
        let mut empty_backoff = PULL_BACKOFF_MIN;
        loop {
            while let Ok(outcome) = ch.outcomes.try_recv() {
                policy.observe(&outcome);
            }
            // Work-sized intake (text models): hold the next batch's work, no more.
            let mut pull_more = false;
            if let Some(hold) = self.hold_work {
                if pull_at.is_none_or(|at| Instant::now() >= at) {
                    let mut pulled = 0usize;
                    while pulled < usize::from(self.prefetch) && self.waiting(policy) < hold {
                        match channel.basic_get(self.amqp.queue.as_str().into(), BasicGetOptions { no_ack: false }).await {
                            Ok(Some(m)) => {
                                pulled += 1;
                                empty_polls = 0;
                                self.receive(Delivery::hold(m.delivery, &self.held), policy, seq, &ch.prepared);
                            }
                            Ok(None) => {
                                pull_at = Some(Instant::now() + empty_backoff);
                                empty_backoff = (empty_backoff * 2).min(PULL_BACKOFF_MAX);
                                break;
                            }
                            Err(e) => {
                                warn!(error = %e, "basic.get failed; reconnecting (unacked messages will be redelivered)");
                                return Ok(SessionEnd::Reconnect);
                            }
                        }
                    }
                    if pulled > 0 {
                        pull_at = None;
                        empty_backoff = PULL_BACKOFF_MIN;
                    }
                    // A full run of pulls with work still wanted: pull again after a look at the rest.
                    pull_more = pulled == usize::from(self.prefetch) && self.waiting(policy) < hold;
                }
            }
            let pull_deadline = match self.hold_work {
                Some(hold) if self.waiting(policy) < hold => pull_at,
                _ => None,
            };
            // Form a batch only when the inference stage can take it (text models: when it is
            // idle): until then the pool keeps absorbing deliveries.
            let queue_free = ch.batches.capacity() > 0;
            let room = queue_free && ch.gate.as_ref().is_none_or(|g| g.is_idle());
            let deadline = if room {
                match policy.decide(Instant::now(), false) {
                    Decision::Flush(flush) => {
                        let max_tokens = flush.items.iter().map(|p| p.tokens).max().unwrap_or(0);
                        let predicted_peak = policy.predicted_peak(flush.items.len(), max_tokens);
                        if let Some(g) = &ch.gate {
                            g.sent();
                        }
                        send(&ch.batches, Assembled { flush, predicted_peak }).await?;
                        continue;
                    }
                    Decision::Wait(at) => at,
                }
            } else {
                None
            };
            tokio::select! {
                _ = shutdown.as_mut() => return Ok(SessionEnd::Stop),
                _ = self.fatal.raised() => return Ok(SessionEnd::Stop),
                permit = ch.batches.reserve(), if !queue_free => {
                    // The inference stage took the queued batch: decide again with a full view.
                    drop(permit.map_err(|_| WorkerError::Stage("inference stage stopped".into()))?);
                }
                _ = idled(ch.gate.as_deref()), if queue_free && !room => {
                    // The inference stage finished its batch: decide again with a full view.
                }
                Some(r) = ch.returns.recv() => self.push(policy, r, seq),
                delivery = next_delivery(&mut consumer), if consumer.is_some() => match delivery {
                    Some(Ok(d)) => {
                        empty_polls = 0;
                        self.receive(Delivery::hold(d, &self.held), policy, seq, &ch.prepared);
                    }
                    Some(Err(e)) => {
                        warn!(error = %e, "consumer failed; reconnecting (unacked messages will be redelivered)");
                        return Ok(SessionEnd::Reconnect);
                    }
                    None => {
                        warn!("the broker cancelled the consumer; re-subscribing");
                        return Ok(SessionEnd::Reconnect);
                    }
                },
                _ = sleep_until(deadline), if deadline.is_some() => {}
                _ = sleep_until(pull_deadline), if pull_deadline.is_some() => {}
                _ = std::future::ready(()), if pull_more => {}
                _ = drain_tick.tick(), if self.drain => {
                    if policy.is_empty() && self.held.get() == 0 {
                        match queue::queue_depths(channel, &self.amqp).await {
                            Ok((0, _)) => {
                                empty_polls += 1;
                                if empty_polls >= 2 {
                                    info!("queue drained");
                                    return Ok(SessionEnd::Stop);
                                }
                            }
                            Ok(_) => empty_polls = 0,
                            Err(e) => debug!(error = %e, "queue depth check failed"),
                        }
                    } else {
                        empty_polls = 0;
                    }
                }
            }
        }
    }

    /// Validates a delivery: a job goes to the policy, poison to the dead-letter queue.
    fn receive(&self, delivery: Delivery, policy: &mut dyn BatchPolicy<Received>, seq: &mut u64, prepared: &mpsc::UnboundedSender<Received>) {
        let received = Instant::now();
        let parsed = parse_job(delivery.body(), &self.limits, true).and_then(|job| match model_input(&job, &self.manifest) {
            Ok(input) => Ok((job, input)),
            Err(kind) => Err(Rejection::of(&job, kind)),
        });
        match parsed {
            // The broker's last allowed delivery: the earlier ones crashed workers.
            Ok((job, _)) if delivery.previous_deliveries() >= u64::from(self.amqp.delivery_limit) => {
                let settler = self.settler.clone();
                tokio::spawn(async move { settler.give_up(&job, delivery).await });
            }
            Ok((job, input)) => match self.voices.lookup(&job.voice) {
                Lookup::Found(voice) => {
                    if let Some(r) = admit(job, input, voice, delivery, self.text.as_ref(), &self.settler) {
                        self.push(policy, r, seq);
                    }
                }
                // A voice added since the last look: ask Postgres before refusing the job.
                Lookup::Unknown if self.voices.is_shared() => {
                    let (voices, text, settler, prepared) = (self.voices.clone(), self.text.clone(), self.settler.clone(), prepared.clone());
                    tokio::spawn(async move {
                        if settler.retry.run("voices", || voices.refresh_after(received)).await.is_err() {
                            settler.outbox.give_back(vec![delivery]).await;
                            return;
                        }
                        match voices.lookup(&job.voice) {
                            Lookup::Found(voice) => {
                                if let Some(r) = admit(job, input, voice, delivery, text.as_ref(), &settler) {
                                    if let Err(mpsc::error::SendError(r)) = prepared.send(r) {
                                        settler.outbox.give_back(vec![r.delivery]).await;
                                    }
                                }
                            }
                            other => settler.reject(voice_rejection(job, other, &voices), delivery).await,
                        }
                    });
                }
                other => {
                    let (settler, rejection) = (self.settler.clone(), voice_rejection(job, other, &self.voices));
                    tokio::spawn(async move { settler.reject(rejection, delivery).await });
                }
            },
            Err(rejection) => {
                let settler = self.settler.clone();
                tokio::spawn(async move { settler.reject(rejection, delivery).await });
            }
        }
    }

    /// Text models: the work waiting for the next batch — estimated speech tokens of the jobs the
    /// policy holds and of those in the frontend.
    fn waiting(&self, policy: &dyn BatchPolicy<Received>) -> usize {
        policy.tokens() + self.text.as_ref().map_or(0, |t| t.preparing.load(std::sync::atomic::Ordering::SeqCst))
    }

    fn push(&self, policy: &mut dyn BatchPolicy<Received>, r: Received, seq: &mut u64) {
        *seq += 1;
        policy.push(Pending { tokens: r.length, priority: r.job.priority, arrived: Instant::now(), seq: *seq, item: r });
    }

    /// Stops consuming, gives back what was never started, and waits until the other stages
    /// have settled what they hold (the connection must stay open for their acks).
    async fn stop_consuming(
        &self,
        channel: &Channel,
        policy: &mut dyn BatchPolicy<Received>,
        batches: mpsc::Sender<Assembled>,
        returns: &mut mpsc::UnboundedReceiver<Received>,
    ) {
        self.stop.cancel();
        if self.hold_work.is_none() {
            let _ = channel.basic_cancel(self.worker_id.as_str().into(), BasicCancelOptions::default()).await;
        }
        let unstarted: Vec<Delivery> = policy.take_all().into_iter().map(|p| p.item.delivery).collect();
        if !unstarted.is_empty() {
            info!(count = unstarted.len(), "returning unstarted jobs to the queue");
        }
        self.outbox.give_back(unstarted).await;
        drop(batches);
        // Jobs still coming back (parked, or prepared by the frontend) go back to the queue too.
        loop {
            tokio::select! {
                _ = self.held.wait_zero() => break,
                Some(r) = returns.recv() => self.outbox.give_back(vec![r.delivery]).await,
            }
        }
    }

    /// Connects to the broker, retrying with back-off until it works or the worker stops.
    async fn connect(&self) -> Option<(Connection, Channel, Option<Consumer>)> {
        let mut attempt = 0;
        loop {
            if self.stop.is_cancelled() {
                return None;
            }
            match self.try_connect().await {
                Ok((conn, channel, outbox, consumer)) => {
                    self.outbox.set_channel(outbox).await;
                    match consumer {
                        Some(_) => info!(queue = %self.amqp.queue, prefetch = self.prefetch, "consuming"),
                        None => info!(queue = %self.amqp.queue, pull = self.prefetch, "pulling the next batch's work (basic.get)"),
                    }
                    return Some((conn, channel, consumer));
                }
                Err(e) if e.is_permanent() => {
                    error!(error = %e, "the broker refused this worker; check the user, password and vhost in amqp.url (AMQP_URL)");
                    self.fatal.raise("RabbitMQ", &e);
                    return None;
                }
                Err(e) => {
                    let wait = backoff(attempt, self.amqp.reconnect_min, self.amqp.reconnect_max);
                    if matches!(e, QueueError::TopologyMismatch { .. }) {
                        error!(error = %e, source = ?std::error::Error::source(&e), retry_in_ms = wait.as_millis() as u64, "cannot consume");
                    } else {
                        warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "broker unavailable; reconnecting");
                    }
                    attempt += 1;
                    tokio::select! { _ = tokio::time::sleep(wait) => {}, _ = self.stop.cancelled() => return None }
                }
            }
        }
    }

    async fn try_connect(&self) -> Result<(Connection, Channel, Channel, Option<Consumer>), QueueError> {
        let amqp = |op: &'static str| move |source: lapin::Error| QueueError::Amqp { op, source };
        let conn = queue::connect(&self.amqp, &format!("voxbatch-worker {}", self.worker_id)).await?;
        let channel = conn.create_channel().await.map_err(amqp("channel.open"))?;
        queue::declare_topology(&channel, &self.amqp).await?;
        channel.basic_qos(self.prefetch, BasicQosOptions { global: false }).await.map_err(amqp("basic.qos"))?;
        let outbox = conn.create_channel().await.map_err(amqp("channel.open"))?;
        outbox.confirm_select(ConfirmSelectOptions::default()).await.map_err(amqp("confirm.select"))?;
        // Text models pull what they hold (`hold_work`): no consumer.
        let consumer = match self.hold_work {
            Some(_) => None,
            None => Some(
                channel
                    .basic_consume(self.amqp.queue.as_str().into(), self.worker_id.as_str().into(), BasicConsumeOptions::default(), FieldTable::default())
                    .await
                    .map_err(amqp("basic.consume"))?,
            ),
        };
        Ok((conn, channel, outbox, consumer))
    }
}

/// A job whose voice is known: a speech-token job is ready for the policy (`Some`); a text job
/// goes to the frontend and comes back through `returns` (`None`).
fn admit(job: Job, input: ModelInput, voice: BookEntry, delivery: Delivery, text: Option<&TextPrep>, settler: &Arc<Settler>) -> Option<Received> {
    match input {
        ModelInput::Tokens(tokens) => {
            let length = crate::model::token2wav::stretched_len(tokens.len(), job.speed) + voice.prompt_tokens;
            Some(Received { job, tokens, voice: voice.index, text: None, length, claim: 0, delivery })
        }
        ModelInput::Text => {
            match text {
                Some(text) => text.spawn(job, voice.index, delivery),
                None => {
                    let settler = settler.clone();
                    let reason = "this worker has no text frontend for its model".to_string();
                    tokio::spawn(async move { settler.fail(job.job_id, &reason, delivery).await });
                }
            }
            None
        }
    }
}

/// Why a job's voice is refused: unknown (with the voices there are) or stored but unusable.
fn voice_rejection(job: Job, lookup: Lookup, voices: &VoiceBook) -> Rejection {
    let kind = match lookup {
        Lookup::Unusable(why) => RejectionKind::InvalidField { field: "voice", reason: why },
        _ => {
            let known = voices.names();
            let known = if known.is_empty() {
                "none yet: add one with `voxbatch voice add NAME --audio FILE --text TRANSCRIPT`".to_string()
            } else {
                known.join(", ")
            };
            RejectionKind::UnknownVoice { voice: job.voice.clone(), known }
        }
    };
    Rejection::of(&job, kind)
}

async fn idled(gate: Option<&InferenceGate>) {
    match gate {
        Some(g) => g.idled().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

async fn send(tx: &mpsc::Sender<Assembled>, batch: Assembled) -> Result<(), WorkerError> {
    tx.send(batch).await.map_err(|_| WorkerError::Stage("inference stage stopped".into()))
}

/// The next delivery of the consumer (never called without one: the select's guard).
async fn next_delivery(consumer: &mut Option<Consumer>) -> Option<Result<lapin::message::Delivery, lapin::Error>> {
    match consumer {
        Some(c) => c.next().await,
        None => std::future::pending().await,
    }
}
