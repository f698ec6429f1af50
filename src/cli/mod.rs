//! The command line's flags (clap): every command, flag and argument with its help. `main.rs`
//! dispatches them. [`voice`] holds `voice` and `dead`, [`bench`] the benchmarks and how their
//! flags become options; [`logging`] sets up the logs, [`progress`] runs the commands that show
//! progress while they run.

pub mod bench;
pub mod logging;
pub mod progress;
pub mod voice;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

use voxbatch::config::Config;
use voxbatch::report::{Dimension, Format};

pub use bench::BenchArgs;
pub use voice::{DeadCommand, VoiceCommand};

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

/// A campaign name as jobs carry it (1-64 of A-Z a-z 0-9 . _ -): an empty or malformed one is
/// refused before anything runs.
pub fn campaign_name(s: &str) -> Result<String, String> {
    voxbatch::job::check_name(s).map(|()| s.to_string())
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create the database if missing, apply migrations, declare the queues, create the bucket.
    Migrate,
    /// Publish jobs from FILE: .txt (one job per non-empty line) or .jsonl (one job object per line).
    ///
    /// Interrupted (SIGINT/SIGTERM), it says how many jobs it published and the exact command that
    /// publishes the rest; a broker that stays unreachable for amqp.publish_give_up ends it with an
    /// error saying the same.
    Enqueue {
        /// The job file.
        file: PathBuf,
        /// Campaign for jobs that do not name one (part of their derived ids).
        #[arg(long, value_parser = campaign_name)]
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
        /// table (a sentence) or json (the summary as an object).
        #[arg(long, default_value = "table")]
        format: Format,
    },
    /// Consume jobs and synthesize them until stopped (SIGINT/SIGTERM finish the current batch).
    Work(WorkArgs),
    /// Queue depth, dead-letter depth, jobs by status and workers (stale ones flagged); with
    /// --campaign, that campaign's progress: jobs by status, audio and characters done, the recent
    /// rate, ETA to drain at that rate, cost so far and projected.
    Status {
        /// One campaign's progress instead of the fleet's.
        #[arg(long, value_parser = campaign_name)]
        campaign: Option<String>,
        /// Refresh every --every until the campaign is settled (with --campaign): a redrawn bar
        /// on a terminal, one line per refresh otherwise (one JSON object per line with
        /// --format json). A campaign no worker has claimed a job of yet is waited for.
        #[arg(long, requires = "campaign")]
        watch: bool,
        /// How often --watch refreshes, e.g. 2s, 500ms.
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration, requires = "watch")]
        every: Duration,
        /// The window the rate is measured over, e.g. 5m, 30s.
        #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
        window: Duration,
        /// table or json.
        #[arg(long, default_value = "table")]
        format: Format,
    },
    /// Stop a campaign: workers ack its queued jobs without synthesis (status `cancelled`, counted
    /// in reports); batches already running finish. --resume undoes it for jobs not yet consumed.
    Cancel {
        /// The campaign to cancel (or resume).
        #[arg(long, value_parser = campaign_name)]
        campaign: String,
        /// Undo a cancel: jobs of the campaign not yet consumed are synthesized again, and its
        /// cancelled jobs run when published again.
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
        #[arg(long, value_parser = campaign_name)]
        campaign: Option<String>,
        /// Speed for jobs that do not set one (the estimated audio is 1/speed as long).
        #[arg(long)]
        speed: Option<f64>,
        /// table or json.
        #[arg(long, default_value = "table")]
        format: Format,
    },
    /// Throughput and cost: jobs, characters, audio hours, device hours (GPU or CPU), real-time
    /// factor, audio-seconds per device-second, $ per audio hour and per million characters,
    /// utilisation, energy.
    Report {
        /// Group by campaign, day, batch_size, precision, gpu, model or stage (CosyVoice2: llm, token2wav).
        #[arg(long, default_value = "campaign")]
        by: Dimension,
        /// Only jobs finished at or after this time (RFC 3339, e.g. 2026-12-01T18:00:00Z, or a date).
        #[arg(long, value_parser = parse_since)]
        since: Option<chrono::DateTime<chrono::Utc>>,
        /// Only this campaign.
        #[arg(long, value_parser = campaign_name)]
        campaign: Option<String>,
        /// table, csv or json.
        #[arg(long, default_value = "table")]
        format: Format,
        /// Also write a chart ($ per audio hour, audio-seconds per device-second) to this .svg or .png file.
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
        #[arg(long, default_value = "demo", value_parser = campaign_name)]
        campaign: String,
        #[command(flatten)]
        model: ModelArgs,
    },
}

/// `--since`: RFC 3339 or a plain date (midnight UTC).
fn parse_since(s: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&chrono::Utc));
    }
    let d = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").map_err(|_| "use RFC 3339 (2026-12-01T18:00:00Z) or YYYY-MM-DD".to_string())?;
    Ok(d.and_time(chrono::NaiveTime::MIN).and_utc())
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

impl WorkArgs {
    /// The worker options and the devices to run on (`--devices`, else the configured one),
    /// with the model flags applied to `cfg`.
    pub fn options(&self, cfg: &mut Config) -> Result<(voxbatch::worker::WorkerOptions, Vec<voxbatch::model::Device>)> {
        self.model.apply(cfg)?;
        let devices = match &self.devices {
            Some(spec) => voxbatch::commands::parse_devices(spec).context("--devices")?,
            None => vec![cfg.model.device],
        };
        Ok((voxbatch::worker::WorkerOptions { drain: self.drain, worker_id: self.worker_id.clone() }, devices))
    }
}

/// `calibrate`'s flags as the calibration's options, with the model flags applied to `cfg`.
pub fn calibrate_options(cfg: &mut Config, model: &ModelArgs, vram_fraction: f64, min_tokens: usize, max_tokens: usize, max_seconds: u64) -> Result<voxbatch::calibrate::CalibrateOptions> {
    model.apply(cfg)?;
    anyhow::ensure!(vram_fraction > 0.0 && vram_fraction <= 1.0, "--vram-fraction must be in (0, 1]");
    Ok(voxbatch::calibrate::CalibrateOptions {
        vram_fraction,
        min_tokens,
        max_tokens,
        max_batch: model.max_batch.unwrap_or(1024),
        time_budget: Duration::from_secs(max_seconds),
        seed: 7,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every flag and argument of every command and subcommand says what it is for in --help.
    #[test]
    fn every_flag_and_argument_of_every_command_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_about().is_none() && sub.get_long_about().is_none() {
                    missing.push(format!("{path} {} (the command)", sub.get_name()));
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "voxbatch", &mut missing);
        assert!(missing.is_empty(), "without help: {missing:#?}");
    }

    #[test]
    fn an_empty_or_malformed_campaign_is_refused_by_every_command_that_takes_one() {
        for args in [
            vec!["voxbatch", "status", "--campaign", ""],
            vec!["voxbatch", "status", "--campaign", "a b"],
            vec!["voxbatch", "cancel", "--campaign", ""],
            vec!["voxbatch", "enqueue", "f.txt", "--campaign", ""],
            vec!["voxbatch", "report", "--campaign", ""],
        ] {
            let e = Cli::try_parse_from(&args).expect_err(&format!("{args:?}"));
            assert!(e.to_string().contains("must be 1-"), "{args:?}: {e}");
        }
        assert!(Cli::try_parse_from(["voxbatch", "status", "--campaign", "book-42", "--watch", "--every", "250ms"]).is_ok());
    }
}
