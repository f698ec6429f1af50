//! voxbatch: a job-queue batch worker for bulk text-to-speech on GPUs.
//!
//! Jobs arrive on RabbitMQ, are grouped into batches, synthesized by a libtorch model on a
//! dedicated thread, encoded as WAV, uploaded to S3 (or a directory), and recorded in Postgres,
//! which is the source of truth for what is done and what it cost. A job's message is acked only
//! after its audio and its rows are committed.
//!
//! # Layout
//! - [`config`]: the one typed configuration (file → env → CLI).
//! - [`job`]: the job message (wire format) and its validation.
//! - [`enqueue`]: job files (`.txt`, `.jsonl`) → validated jobs.
//! - [`queue`]: RabbitMQ topology, publishing with confirms, dead-lettering.
//! - [`batch`]: batch assembly policy (pure state machine).
//! - [`model`]: model directories, manifests, tokenizer, inference thread; the TorchScript models
//!   and CosyVoice2's token2wav ([`model::cosyvoice2`]).
//! - [`audio`]: waveform → WAV bytes + sha256.
//! - [`storage`]: S3 / file store for audio.
//! - [`db`]: Postgres schema, claims, batch commits, rejections.
//! - [`report`]: per-campaign reports.
//! - [`worker`]: wires the stages: consume → batch → infer → encode → upload → record → ack.
//! - [`commands`]: what each CLI command does (the binary only parses flags).

pub mod audio;
pub mod batch;
pub mod bench;
pub mod calibrate;
pub mod commands;
pub mod config;
pub mod cost;
pub mod db;
pub mod enqueue;
pub mod gpu;
pub mod job;
pub mod model;
pub mod queue;
pub mod report;
pub mod storage;
pub mod worker;
