//! The command line's flags (clap). `main.rs` dispatches them.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

use voxbatch::config::Config;
use voxbatch::report::{Dimension, Format};

/// Job-queue batch worker for bulk text-to-speech on GPUs.
///
/// Configuration: built-in defaults (config/default.toml) < --config FILE < environment
/// (VOXBATCH_SECTION__KEY, AMQP_URL, DATABASE_URL, S3_ENDPOINT, AWS_*) < flags.
#[derive(Parser, Debug)]
#[command(name = "voxbatch", version, about, long_about = None)]
pub struct Cli {
    /// TOML file overriding config/default.toml (any subset of its keys).
    #[arg(long, global = true, env = "VOXBATCH_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Log format: text or json. Levels come from RUST_LOG (default info).
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create the database if missing, apply migrations, declare the queues, create the bucket.
    Migrate,
    /// Publish jobs from FILE: .txt (one job per non-empty line) or .jsonl (one job object per line).
    Enqueue {
        /// The job file.
        file: PathBuf,
        /// Campaign for jobs that do not name one.
        #[arg(long)]
        campaign: Option<String>,
        /// Voice for jobs that do not name one.
        #[arg(long)]
        voice: Option<String>,
        /// Speed for jobs that do not set one (CosyVoice2 models; 0.5–2.0; other models refuse it).
        #[arg(long)]
        speed: Option<f64>,
        /// Skip the first N jobs of the file (resuming an interrupted enqueue; running it again
        /// without this is safe too: the ids are the same and done jobs are not synthesized twice).
        #[arg(long, default_value_t = 0)]
        skip: usize,
    },
    /// Consume jobs and synthesize them until stopped (SIGINT/SIGTERM finish the current batch).
    Work(WorkArgs),
    /// Queue depth, dead-letter depth, jobs by status and workers (stale ones flagged); with
    /// --campaign, that campaign's progress: jobs by status, audio and characters done, the recent
    /// rate, ETA to drain at that rate, cost so far and projected.
    Status {
        /// One campaign's progress instead of the fleet's.
        #[arg(long)]
        campaign: Option<String>,
        /// Redraw every 2 s until the campaign is settled (with --campaign).
        #[arg(long, requires = "campaign")]
        watch: bool,
        /// The window the rate is measured over, e.g. 5m, 30s.
        #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
        window: std::time::Duration,
        /// table (text) or json.
        #[arg(long, default_value = "table")]
        format: Format,
    },
    /// Stop a campaign: workers ack its queued jobs without synthesis (status `cancelled`, counted
    /// in reports); batches already running finish. --resume undoes it for jobs not yet consumed.
    Cancel {
        #[arg(long)]
        campaign: String,
        #[arg(long)]
        resume: bool,
    },
    /// The dead-letter queue: list what is there and why, requeue jobs after a fix, or purge.
    Dead {
        #[command(subcommand)]
        command: DeadCommand,
    },
    /// CosyVoice2 voices from recordings, kept in Postgres for every worker of the model.
    Voice {
        #[command(subcommand)]
        command: VoiceCommand,
    },
    /// Dry run of the text frontend on a job file, before any GPU time is bought: per job the
    /// normalised text, its segments with token counts, the estimated audio length and cost; totals.
    Text {
        /// The job file (.txt or .jsonl, as `enqueue` reads it), or - for standard input.
        file: PathBuf,
        /// The converted CosyVoice2 model directory (its tokenizer.json and fsts/); default: [model] dir.
        #[arg(long)]
        model: Option<PathBuf>,
        /// GPU whose [cost] price the estimate uses.
        #[arg(long, default_value = "H200")]
        gpu: String,
        /// Campaign for jobs that do not name one.
        #[arg(long)]
        campaign: Option<String>,
        /// Speed for jobs that do not set one (the estimated audio is 1/speed as long).
        #[arg(long)]
        speed: Option<f64>,
        /// table or json.
        #[arg(long, default_value = "table")]
        format: Format,
    },
    /// Throughput and cost: jobs, characters, audio hours, GPU hours, real-time factor,
    /// audio-seconds per GPU-second, $ per audio hour and per million characters, utilisation, energy.
    Report {
        /// Group by campaign, day, batch_size, precision, gpu, model or stage (CosyVoice2: llm, token2wav).
        #[arg(long, default_value = "campaign")]
        by: Dimension,
        /// Only jobs finished at or after this time (RFC 3339, e.g. 2026-12-01T18:00:00Z, or a date).
        #[arg(long)]
        since: Option<String>,
        /// Only this campaign.
        #[arg(long)]
        campaign: Option<String>,
        /// table, csv or json.
        #[arg(long, default_value = "table")]
        format: Format,
        /// Also write a chart ($ per audio hour, audio-seconds per GPU-second) to this .svg or .png file.
        #[arg(long, value_name = "FILE.svg|FILE.png")]
        plot: Option<PathBuf>,
    },
    /// Check that every done job of a campaign has its audio object as its row describes it (size;
    /// with --deep also sha256 and batch), and list objects no done row names.
    Audit {
        /// The campaign to check.
        #[arg(long)]
        campaign: String,
        /// Also read every object and check its sha256 and batch against its row (slower: reads
        /// all the campaign's audio).
        #[arg(long)]
        deep: bool,
        /// table or json.
        #[arg(long, default_value = "table")]
        format: Format,
    },
    /// Measure peak memory over batch size × length and fit the model the batch policy uses.
    Calibrate {
        #[command(flatten)]
        model: ModelArgs,
        /// Ceiling as a fraction of device memory (host memory on CPU).
        #[arg(long, default_value_t = 0.8)]
        vram_fraction: f64,
        /// Shortest padded length swept, in input tokens (powers of two from here).
        #[arg(long, default_value_t = 16)]
        min_tokens: usize,
        /// Longest padded length swept, in input tokens.
        #[arg(long, default_value_t = 4096)]
        max_tokens: usize,
        /// Stop the sweep after this many seconds and fit what was measured.
        #[arg(long, default_value_t = 600)]
        max_seconds: u64,
        /// Do not record the profile in Postgres (the JSON file is always written).
        #[arg(long)]
        no_db: bool,
    },
    /// The sweet-spot bench (or `bench policy`): tables, JSON and plots under bench/results/.
    Bench(BenchArgs),
    /// Migrate, enqueue the bundled sample corpus, drain it with a worker, print the report.
    Demo {
        /// Corpus to enqueue (.txt or .jsonl).
        #[arg(long, default_value = "corpus/sample.jsonl")]
        corpus: PathBuf,
        /// Campaign name for the demo's jobs.
        #[arg(long, default_value = "demo")]
        campaign: String,
        #[command(flatten)]
        model: ModelArgs,
    },
}

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

/// Which dead-lettered messages a `dead` command acts on.
#[derive(Args, Debug, Clone)]
pub struct DeadSelect {
    /// Only jobs of this campaign.
    #[arg(long)]
    pub campaign: Option<String>,
    /// Only messages rejected with this code (e.g. `unknown_voice`; `broker` for messages the
    /// broker dead-lettered at the delivery limit).
    #[arg(long)]
    pub code: Option<String>,
    /// At most N matching messages.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
}

#[derive(Subcommand, Debug)]
pub enum DeadCommand {
    /// What the dead-letter queue holds: job, campaign, code, reason, when, attempts. Nothing is
    /// consumed: every message stays in the queue.
    List {
        #[command(flatten)]
        select: DeadSelect,
        /// table or json.
        #[arg(long, default_value = "table")]
        format: Format,
    },
    /// Republish matching messages to the job queue (broker-confirmed, then removed from the
    /// dead-letter queue; safe to interrupt and run again).
    Requeue {
        #[command(flatten)]
        select: DeadSelect,
        /// Say what would be requeued; change nothing.
        #[arg(long)]
        dry_run: bool,
        #[arg(long, default_value = "table")]
        format: Format,
    },
    /// Remove matching messages from the dead-letter queue for good (their rows stay in Postgres).
    Purge {
        #[command(flatten)]
        select: DeadSelect,
        /// Required: purging cannot be undone.
        #[arg(long)]
        yes: bool,
        #[arg(long, default_value = "table")]
        format: Format,
    },
}

#[derive(Subcommand, Debug)]
pub enum VoiceCommand {
    /// Register a zero-shot voice from a 1-30 s recording (WAV, FLAC, MP3 or Ogg Vorbis) and the
    /// words spoken in it. Running workers of the model pick it up without a restart.
    Add {
        /// The voice's name, as jobs give it (`"voice": "NAME"`): A-Z a-z 0-9 . _ -
        name: String,
        /// The prompt recording.
        #[arg(long, value_name = "FILE")]
        audio: PathBuf,
        /// Its transcript.
        #[arg(long)]
        text: String,
        /// The converted CosyVoice2 model directory; default: [model] dir.
        #[arg(long, value_name = "DIR")]
        model: Option<PathBuf>,
        /// Overwrite a voice of that name.
        #[arg(long)]
        replace: bool,
        /// table or json.
        #[arg(long, default_value = "table")]
        format: Format,
    },
    /// The model's voices (every model's with --all).
    List {
        #[arg(long, value_name = "DIR")]
        model: Option<PathBuf>,
        #[arg(long)]
        all: bool,
        #[arg(long, default_value = "table")]
        format: Format,
    },
    /// One voice: its prompt, transcript and source recording.
    Show {
        name: String,
        #[arg(long, value_name = "DIR")]
        model: Option<PathBuf>,
    },
    /// Remove a voice; workers forget it at their next refresh and refuse jobs naming it.
    Rm {
        name: String,
        #[arg(long, value_name = "DIR")]
        model: Option<PathBuf>,
    },
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
        #[arg(long, value_delimiter = ',', default_value = "1,8,32,64,128,256,512")]
        slots: Vec<usize>,
        /// Requests per point: this many per slot (at least --min-requests).
        #[arg(long, default_value_t = 2)]
        requests_per_slot: usize,
        #[arg(long, default_value_t = 4)]
        min_requests: usize,
        /// Decode eagerly (no CUDA graphs).
        #[arg(long)]
        no_graphs: bool,
        /// The reference run's JSON (tools/bench_llm_reference.py), shown beside.
        #[arg(long, value_name = "FILE")]
        reference: Option<PathBuf>,
        /// Where results go.
        #[arg(long, default_value = "bench/results")]
        out: PathBuf,
    },
    /// Print the policy bench's synthetic corpus as JSONL (for `enqueue`), same seed, same texts.
    Corpus {
        #[arg(long, default_value_t = 400)]
        jobs: usize,
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
}

#[derive(Args, Debug)]
pub struct ModelArgs {
    /// Model directory (model.toml + weights).
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    /// cpu or cuda:N.
    #[arg(long)]
    pub device: Option<String>,
    /// fp32, tf32, fp16 or bf16.
    #[arg(long)]
    pub precision: Option<String>,
    /// Hard cap on jobs per batch (batching.max_batch). For text models (kind cosyvoice2) it caps
    /// each token2wav bucket; their batches of jobs are capped by --max-text-jobs.
    #[arg(long)]
    pub max_batch: Option<usize>,
    /// Text models: hard cap on jobs per batch (batching.max_text_jobs; default the LLM's slots × 8).
    #[arg(long)]
    pub max_text_jobs: Option<usize>,
}

#[derive(Args, Debug)]
pub struct WorkArgs {
    /// Exit 0 once the queue is empty and every job taken is committed.
    #[arg(long)]
    pub drain: bool,
    /// Worker id recorded in Postgres (default: host-pid-random).
    #[arg(long)]
    pub worker_id: Option<String>,
    /// One worker per device in this process: `all` (every CUDA device) or `0,1,…` (overrides --device).
    #[arg(long, value_name = "all|0,1,…")]
    pub devices: Option<String>,
    /// Workers per device (with --devices, or on --device): e.g. two sharing one GPU.
    #[arg(long, default_value_t = 1)]
    pub workers_per_device: usize,
    #[command(flatten)]
    pub model: ModelArgs,
}

impl ModelArgs {
    pub fn apply(&self, cfg: &mut Config) -> Result<()> {
        if let Some(dir) = &self.model {
            cfg.model.dir = dir.clone();
        }
        if let Some(d) = &self.device {
            cfg.model.device = d.parse().context("--device")?;
        }
        if let Some(p) = &self.precision {
            cfg.model.precision = p.parse().context("--precision")?;
        }
        if let Some(n) = self.max_text_jobs {
            anyhow::ensure!(n > 0, "--max-text-jobs must be > 0");
            cfg.batching.max_text_jobs = Some(n);
        }
        if let Some(b) = self.max_batch {
            anyhow::ensure!(b > 0, "--max-batch must be > 0");
            cfg.batching.max_batch = b;
        }
        Ok(())
    }
}

