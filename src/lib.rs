//! voxbatch: a job-queue batch worker for bulk text-to-speech on GPUs.
//!
//! Jobs arrive on RabbitMQ, are grouped into batches, synthesized by a libtorch model on a
//! dedicated thread, encoded as WAV, uploaded to S3 (or a directory), and recorded in Postgres,
//! which is the source of truth for what is done and what it cost. A job's message is acked only
//! after its audio and its rows are committed.
//!
//! # Layout
//! - [`config`]: the one typed configuration (file → env → CLI), a file per section.
//! - [`job`]: the job message (wire format) and its validation.
//! - [`enqueue`]: job files (`.txt`, `.jsonl`) → validated jobs with stable ids.
//! - [`queue`]: RabbitMQ topology, publishing with confirms, dead-lettering.
//! - [`batch`]: batch assembly policy (pure state machine), memory model, split-on-failure rule.
//! - [`sizing`]: which policy a worker runs: memory budget, calibration profiles on disk.
//! - [`calibrate`]: measures peak memory and fits the profile.
//! - [`model`]: model directories, manifests, tokenizer, inference thread; the TorchScript models,
//!   a folder per CosyVoice family ([`model::cosyvoice2`], [`model::cosyvoice3`]) over the pieces
//!   they share (`model::flow_matching`, `model::vocoder`, `model::token2wav`, `model::layers`).
//! - [`frontend`]: CosyVoice2's text frontend: normalisation, segments, tokenizer.
//! - [`voice`]: voices from recordings (features, ONNX models) and a worker's voice book.
//! - [`device`]: what a worker runs on (cpu, cuda:N) and at which precision (a leaf).
//! - [`gpu`]: NVML: device memory, per-batch sampler; `torch_shim`: the libtorch C++ shim (`csrc/`).
//! - [`audio`]: waveform → WAV, FLAC, MP3 or Ogg Opus bytes + sha256.
//! - [`storage`]: S3 / file store for audio, the object key layout.
//! - [`metrics`]: the worker's Prometheus endpoint.
//! - [`db`]: Postgres schema, claims, batch commits, rejections, voices.
//! - [`cost`]: prices and per-batch cost.
//! - [`worker`]: the pipeline, a file per stage: intake → infer → commit, delivery, retry.
//! - [`transience`]: whether an error heals by waiting (the stages' errors say; `worker::retry` reads).
//! - [`report`]: throughput and cost reports; [`plot`]: their charts.
//! - [`bench`]: the benchmarks.
//! - [`commands`]: what each CLI command does, a file per command (the binary only parses flags).

pub mod audio;
pub mod batch;
pub mod bench;
pub mod calibrate;
pub mod commands;
pub mod config;
pub mod cost;
pub mod db;
pub mod device;
pub mod enqueue;
pub mod frontend;
pub mod gpu;
pub mod job;
pub mod metrics;
pub mod model;
pub mod plot;
pub mod queue;
pub mod report;
pub mod sizing;
pub mod storage;
pub(crate) mod torch_shim;
pub mod transience;
pub mod voice;
pub mod worker;
