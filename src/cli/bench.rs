//! Flags of `voxbatch bench …`, and how they become each benchmark's options (`commands::BenchRun`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use voxbatch::bench::{llm::LlmBenchOptions, sweetspot::SweetSpotOptions, token2wav::Token2WavBenchOptions};
use voxbatch::commands::BenchRun;
use voxbatch::config::Config;
use voxbatch::model::flow_graphs::FlowGraphSettings;

use super::ModelArgs;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    #[command(flatten)]
    pub sweet: SweetSpotArgs,
}

/// Baseline, precision and quality, batch sweep, knee, soak, cost table, recommended config.
#[derive(Args, Debug)]
pub struct SweetSpotArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Precisions to compare (fp32 is always the reference).
    #[arg(long, value_delimiter = ',', default_value = "fp32,tf32,fp16,bf16")]
    pub precisions: Vec<String>,
    /// Length of each synthetic utterance, in seconds of audio.
    #[arg(long, default_value_t = 10.0)]
    pub utterance_seconds: f64,
    /// VRAM ceiling as a fraction of device memory.
    #[arg(long, default_value_t = 0.8)]
    pub vram_fraction: f64,
    /// Soak at the sweet spot for this many minutes (0 = skip).
    #[arg(long, default_value_t = 2.0)]
    pub soak_minutes: f64,
    /// Timed repetitions per point (median reported).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Precisions under this SNR against fp32 are not recommended.
    #[arg(long, default_value_t = 20.0)]
    pub min_snr_db: f64,
    /// Where results go.
    #[arg(long, default_value = "bench/results")]
    pub out: PathBuf,
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// The memory-aware policy against fixed batch sizes 1, 2, 4, … on a mixed-length corpus.
    Policy {
        #[command(flatten)]
        model: ModelArgs,
        /// Jobs in the synthetic corpus.
        #[arg(long, default_value_t = 400)]
        jobs: usize,
        /// Corpus seed.
        #[arg(long, default_value_t = 7)]
        seed: u64,
        /// Budget as a fraction of device memory (overrides memory.vram_fraction).
        #[arg(long)]
        vram_fraction: Option<f64>,
        /// Where results go.
        #[arg(long, default_value = "bench/results")]
        out: PathBuf,
        /// Run only the policy (no fixed batch sizes): the model-only figure for an end-to-end run.
        #[arg(long)]
        policy_only: bool,
    },
    /// Token2wav (CosyVoice2 or CosyVoice3): audio-s/s per batch size and precision, peak memory,
    /// time per stage.
    Token2wav {
        /// A cosyvoice2-token2wav, cosyvoice2 or cosyvoice3-token2wav model directory
        /// (tools/convert_cosyvoice.py).
        #[arg(long, value_name = "DIR")]
        model: PathBuf,
        /// cpu or cuda:N.
        #[arg(long, default_value = "cpu")]
        device: String,
        /// The flow's precisions.
        #[arg(long, value_delimiter = ',', default_value = "fp32,fp16,bf16")]
        precisions: Vec<String>,
        /// The HiFT vocoder's precisions, each with every flow precision (default: the model's
        /// `vocoder_precision`; tf32 is how the official code runs it).
        #[arg(long, value_delimiter = ',')]
        vocoders: Vec<String>,
        /// Batch sizes to measure.
        #[arg(long, value_delimiter = ',', default_value = "1,8,32,64,128")]
        batches: Vec<usize>,
        /// Length of each utterance, in seconds of audio (25 speech tokens a second).
        #[arg(long, default_value_t = 10.0)]
        utterance_seconds: f64,
        /// Timed repetitions per point, after one warm-up (median reported).
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// Let cuDNN time its convolution algorithms per shape and keep the fastest (torch's
        /// `cudnn.benchmark`; off by default, as the official code runs). The warm-up pays the tuning.
        #[arg(long)]
        cudnn_benchmark: bool,
        /// Let attention run as cuDNN's (`[model] cudnn_attention`; off, as the worker runs by
        /// default: cuDNN builds a graph for each new shape).
        #[arg(long)]
        cudnn_attention: bool,
        /// After the first setting's sweep, one run of its largest batch under libtorch's
        /// profiler: time by kernel category and the longest kernels (on a GPU; operators on a CPU).
        #[arg(long)]
        profile: bool,
        /// Replay small batches' compiled flow steps as CUDA graphs, keeping at most this many
        /// (`[model] flow_graphs`; 0: none, the default here).
        #[arg(long, default_value_t = 0)]
        flow_graphs: usize,
        /// The largest flow step captured as a graph: rows × mel frames (`[model] flow_graph_max_frames`).
        #[arg(long, default_value_t = 32_768)]
        flow_graph_max_frames: i64,
        /// Where results go.
        #[arg(long, default_value = "bench/results")]
        out: PathBuf,
    },
    /// CosyVoice2 speech-token LM: tokens/s per slot count (forced output lengths), against the
    /// reference at batch 1 (tools/bench_llm_reference.py's JSON via --reference).
    Llm {
        /// A model directory with [cosyvoice2.llm] (tools/convert_cosyvoice.py).
        #[arg(long, value_name = "DIR")]
        model: PathBuf,
        /// cpu or cuda:N.
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Slot counts (sequences decoded at once) to measure.
        #[arg(long, value_delimiter = ',', default_value = "1,8,32,64,128,256,512")]
        slots: Vec<usize>,
        /// Requests per point: this many per slot (at least --min-requests).
        #[arg(long, default_value_t = 2)]
        requests_per_slot: usize,
        /// The fewest requests per point, whatever the slot count.
        #[arg(long, default_value_t = 4)]
        min_requests: usize,
        /// Decode eagerly (no CUDA graphs).
        #[arg(long)]
        no_graphs: bool,
        /// After each slot count's run, its step alone (10 steps over all slots, every row reading
        /// 512 positions) under libtorch's profiler: the step's kernels by category and the longest.
        #[arg(long)]
        profile: bool,
        /// The reference run's JSON (tools/bench_llm_reference.py), shown beside.
        #[arg(long, value_name = "FILE")]
        reference: Option<PathBuf>,
        /// Where results go.
        #[arg(long, default_value = "bench/results")]
        out: PathBuf,
    },
    /// Print the policy bench's synthetic corpus as JSONL (for `enqueue`), same seed, same texts.
    Corpus {
        /// Jobs in the corpus.
        #[arg(long, default_value_t = 400)]
        jobs: usize,
        /// Corpus seed (the policy bench's default gives its corpus).
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
}


fn precisions(list: &[String]) -> Result<Vec<voxbatch::model::Precision>> {
    list.iter().map(|p| p.parse().context("--precisions")).collect()
}

impl BenchArgs {
    /// The benchmark these flags ask for (model flags applied to `cfg`; `--reference` read).
    pub fn into_run(self, cfg: &mut Config) -> Result<BenchRun> {
        Ok(match self.command {
            None => {
                let sweet = self.sweet;
                sweet.model.apply(cfg)?;
                let opts = SweetSpotOptions {
                    model_dir: cfg.model.dir.clone(),
                    device: cfg.model.device,
                    precisions: precisions(&sweet.precisions)?,
                    utterance_seconds: sweet.utterance_seconds,
                    max_batch: sweet.model.max_batch.unwrap_or(1024),
                    vram_fraction: sweet.vram_fraction,
                    soak: std::time::Duration::from_secs_f64(sweet.soak_minutes.max(0.0) * 60.0),
                    repeats: sweet.repeats,
                    knee_gain: 0.05,
                    min_snr_db: sweet.min_snr_db,
                    prices: cfg.cost.prices.clone(),
                    cpu_threads: cfg.model.cpu_threads,
                };
                BenchRun::SweetSpot(opts, sweet.out)
            }
            Some(BenchCommand::Token2wav {
                model,
                device,
                precisions: flow,
                vocoders,
                batches,
                utterance_seconds,
                repeats,
                cudnn_benchmark,
                cudnn_attention,
                profile,
                flow_graphs,
                flow_graph_max_frames,
                out,
            }) => BenchRun::Token2wav(
                Token2WavBenchOptions {
                    model_dir: model,
                    device: device.parse().context("--device")?,
                    precisions: precisions(&flow)?,
                    vocoders: precisions(&vocoders)?,
                    batches,
                    utterance_seconds,
                    repeats: repeats.max(1),
                    cudnn_benchmark,
                    cudnn_attention,
                    profile,
                    flow_graphs: FlowGraphSettings { graphs: flow_graphs, max_frames: flow_graph_max_frames.max(1) },
                    seed: 7,
                },
                out,
            ),
            Some(BenchCommand::Llm { model, device, slots, requests_per_slot, min_requests, no_graphs, profile, reference, out }) => {
                let reference = match reference {
                    Some(path) => {
                        let bytes = std::fs::read(&path).with_context(|| format!("read {}", path.display()))?;
                        Some(serde_json::from_slice(&bytes).with_context(|| format!("{}: not a reference run", path.display()))?)
                    }
                    None => None,
                };
                let opts = LlmBenchOptions {
                    model_dir: model,
                    device: device.parse().context("--device")?,
                    slots,
                    requests_per_slot,
                    min_requests,
                    graphs: !no_graphs,
                    profile,
                    seed: 11,
                    reference,
                };
                BenchRun::Llm(opts, out)
            }
            Some(BenchCommand::Corpus { jobs, seed }) => BenchRun::Corpus { jobs, seed },
            Some(BenchCommand::Policy { model, jobs, seed, vram_fraction, out, policy_only }) => {
                model.apply(cfg)?;
                if let Some(f) = vram_fraction {
                    cfg.memory.vram_fraction = f;
                }
                BenchRun::Policy { jobs, seed, policy_only, out }
            }
        })
    }
}
