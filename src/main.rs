//! `voxbatch`: the command line. Parses flags, sets up logging, calls `voxbatch::commands`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use tracing_subscriber::EnvFilter;

use voxbatch::commands;
use voxbatch::config::Config;
use voxbatch::enqueue::LineDefaults;
use voxbatch::report::{self, Dimension, Format};
use voxbatch::worker::{WorkerOptions, WorkerSummary};

mod cli;
use cli::{BenchArgs, BenchCommand, Cli, Command, DeadCommand, VoiceCommand, WorkArgs};

fn init_logging(format: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,lapin=warn,aws=warn"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(std::io::stderr().is_terminal());
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutdown requested: finishing what is in flight, returning the rest to the queue");
}

fn progress_bar(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(&format!("{{spinner}} {what} [{{bar:40}}] {{pos}}/{{len}} ({{per_sec}}, eta {{eta}})"))
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line with the whole chain, then what to check when the cause is permanent.
            eprintln!("error: {e:#}");
            if let Some(hint) = e.chain().find_map(voxbatch::commands::hint) {
                eprintln!("hint: {hint}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<()> {
    let cli = Cli::parse();
    init_logging(&cli.log_format);
    let env: BTreeMap<String, String> = std::env::vars().collect();
    for var in voxbatch::config::unknown_env_vars(&env) {
        tracing::warn!(var, "ignored: VOXBATCH_ variables that set configuration are VOXBATCH_<SECTION>__<KEY> (two underscores)");
    }
    let mut cfg = Config::load(cli.config.as_deref(), &env).context("configuration")?;
    match cli.command {
        Command::Migrate => {
            commands::migrate(&cfg).await.context("migrate")?;
            println!("migrated: database, queue topology ({} → {}), storage ready", cfg.amqp.exchange, cfg.amqp.queue);
        }
        Command::Enqueue { file, campaign, voice, speed, skip } => enqueue(&cfg, &file, &LineDefaults { campaign, voice, speed }, skip).await?,
        Command::Work(args) => work(&mut cfg, args).await?,
        Command::Status { campaign: None, format: Format::Json, .. } => anyhow::bail!("status --format json needs --campaign"),
        Command::Status { campaign: None, .. } => print_status(&commands::status(&cfg).await.context("status")?),
        Command::Status { campaign: Some(campaign), watch, window, format } => campaign_status(&cfg, &campaign, watch, window, format).await?,
        Command::Voice { command } => voice(&cfg, command).await?,
        Command::Dead { command } => dead(&cfg, command).await?,
        Command::Cancel { campaign, resume } => {
            let changed = commands::cancel(&cfg, &campaign, resume).await.context("cancel")?;
            match (resume, changed) {
                (false, true) => println!("cancelled campaign {campaign}: workers ack its queued jobs without synthesis (status cancelled); batches running now finish"),
                (false, false) => println!("campaign {campaign} was already cancelled"),
                (true, true) => println!("resumed campaign {campaign}: its jobs not yet consumed are synthesized again"),
                (true, false) => println!("campaign {campaign} was not cancelled"),
            }
        }
        Command::Text { file, model, gpu, campaign, speed, format } => {
            let dir = model.unwrap_or_else(|| cfg.model.dir.clone());
            let defaults = LineDefaults { campaign, voice: None, speed };
            let cfg2 = cfg.clone();
            let report = tokio::task::spawn_blocking(move || commands::text_dry_run(&cfg2, &dir, &file, &defaults, &gpu)).await.context("text")??;
            match format {
                Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
                _ => print!("{}", commands::text_table(&report)),
            }
        }
        Command::Report { by, since, campaign, format, plot } => print_report(&cfg, by, since.as_deref(), campaign.as_deref(), format, plot.as_deref()).await?,
        Command::Audit { campaign, deep, format } => audit(&cfg, &campaign, deep, format).await?,
        Command::Calibrate { model, vram_fraction, min_tokens, max_tokens, max_seconds, no_db } => {
            model.apply(&mut cfg)?;
            anyhow::ensure!(vram_fraction > 0.0 && vram_fraction <= 1.0, "--vram-fraction must be in (0, 1]");
            let opts = voxbatch::calibrate::CalibrateOptions {
                vram_fraction,
                min_tokens,
                max_tokens,
                max_batch: model.max_batch.unwrap_or(1024),
                time_budget: std::time::Duration::from_secs(max_seconds),
                seed: 7,
            };
            calibrate(&cfg, &opts, no_db).await?;
        }
        Command::Bench(args) => bench(&mut cfg, args).await?,
        Command::Demo { corpus, campaign, model } => {
            model.apply(&mut cfg)?;
            demo(&cfg, &corpus, &campaign).await?;
        }
    }
    Ok(())
}

async fn enqueue(cfg: &Config, file: &Path, defaults: &LineDefaults, skip: usize) -> Result<()> {
    let started = Instant::now();
    let pb = progress_bar(0, "publishing");
    let s = commands::enqueue(cfg, file, defaults, skip, shutdown_signal(), |total, done| {
        pb.set_length(total as u64);
        pb.set_position(done as u64);
    })
    .await
    .with_context(|| format!("enqueue {}", file.display()))?;
    pb.finish_and_clear();
    let campaigns: Vec<String> = s.campaigns.iter().map(|(c, n)| format!("{c} ({n})")).collect();
    println!(
        "enqueued {} job(s) to {} in {:.1}s{}, campaign: {}",
        s.enqueued,
        cfg.amqp.queue,
        started.elapsed().as_secs_f64(),
        if s.skipped > 0 { format!(" (skipped the first {})", s.skipped) } else { String::new() },
        campaigns.join(", ")
    );
    if s.interrupted {
        let done = s.skipped + s.enqueued;
        eprintln!(
            "interrupted: {done} of {} job(s) of {} are published. Resume with `voxbatch enqueue {} --skip {done}` \
             (or run the same command again: job ids are derived from the file, so nothing is synthesized twice)",
            s.total,
            file.display(),
            file.display()
        );
        std::process::exit(130);
    }
    Ok(())
}

async fn work(cfg: &mut Config, args: WorkArgs) -> Result<()> {
    args.model.apply(cfg)?;
    let opts = WorkerOptions { drain: args.drain, worker_id: args.worker_id };
    let devices = match &args.devices {
        Some(spec) => commands::parse_devices(spec).context("--devices")?,
        None => vec![cfg.model.device],
    };
    let mut serving = false;
    if let Some(addr) = cfg.metrics.listen {
        // An ops endpoint that cannot start (the port taken by another worker on this host) is
        // said loudly, but synthesis goes on.
        match voxbatch::metrics::serve(addr) {
            Ok(()) => {
                tracing::info!(%addr, "serving Prometheus metrics on /metrics");
                serving = true;
            }
            Err(e) => tracing::error!(error = %voxbatch::worker::error_chain(&e), "metrics not served; set metrics.listen to a free port or \"off\""),
        }
    }
    for s in commands::work(cfg, &devices, args.workers_per_device, opts, shutdown_signal()).await.context("worker")? {
        print_worker(&s);
    }
    // A drained worker's last batch must still be scraped: the endpoint stays up a while
    // (`metrics.linger`), or until a signal.
    if serving && args.drain && !cfg.metrics.linger.is_zero() {
        tracing::info!(linger_s = cfg.metrics.linger.as_secs_f64(), "queue drained; /metrics stays up for the last scrape");
        tokio::select! { _ = tokio::time::sleep(cfg.metrics.linger) => {}, _ = shutdown_signal() => {} }
    }
    Ok(())
}

fn print_worker(s: &WorkerSummary) {
    println!(
        "worker {}: {} batch(es), {} job(s) done, {} failed, {} already done, {} cancelled, {} rejected, {:.1} s of audio",
        s.worker_id, s.batches, s.jobs_done, s.jobs_failed, s.already_done, s.cancelled, s.rejected, s.audio_seconds
    );
}

fn print_status(s: &commands::Status) {
    use voxbatch::job::escape_controls as esc;
    match &s.depths {
        Ok((ready, dead)) => {
            println!("queue {}: {ready} ready", s.queue);
            println!("dead-letter queue {}: {dead} message(s)", s.dead_letter_queue);
        }
        Err(e) => println!("RabbitMQ: UNREACHABLE ({})", esc(e)),
    }
    match &s.storage {
        Ok(()) => println!("storage: ok"),
        Err(e) => println!("storage: UNREACHABLE ({}): workers hold and retry, nothing is lost", esc(e)),
    }
    match &s.jobs_by_status {
        Ok(jobs) => {
            println!("jobs by status:");
            if jobs.is_empty() {
                println!("  (none)");
            }
            for (status, n) in jobs {
                println!("  {status:<9} {n}");
            }
        }
        Err(e) => println!("Postgres: UNREACHABLE ({})", esc(e)),
    }
    if s.orphaned_running > 0 {
        println!("{} running job(s) have no live worker: they run again when the broker redelivers them", s.orphaned_running);
    }
    if !s.workers.is_empty() {
        println!("workers:");
        for w in &s.workers {
            println!("  {:<40} {:<8} {:<7} last heartbeat {:.0} s ago", esc(&w.worker_id), w.device, w.state, w.seconds_since_heartbeat);
        }
    }
    if !s.rejections_by_code.is_empty() {
        println!("rejected or dead-lettered, by code:");
        for (code, n) in &s.rejections_by_code {
            println!("  {code:<22} {n}");
        }
    }
}

/// `--since`: RFC 3339 or a plain date (midnight UTC).
fn parse_since(s: &str) -> Result<chrono::DateTime<chrono::Utc>> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&chrono::Utc));
    }
    let d = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").with_context(|| format!("--since {s}: use RFC 3339 or YYYY-MM-DD"))?;
    Ok(d.and_time(chrono::NaiveTime::MIN).and_utc())
}

async fn print_report(cfg: &Config, by: Dimension, since: Option<&str>, campaign: Option<&str>, format: Format, plot: Option<&Path>) -> Result<()> {
    let since = since.map(parse_since).transpose()?;
    let r = commands::report(cfg, by, since, campaign).await.context("report")?;
    println!("{}", report::render(&r, format));
    if let Some(path) = plot {
        let written = commands::write_plot(&r, path).await.context("plot")?;
        eprintln!("wrote {}", written.display());
    }
    Ok(())
}

async fn audit(cfg: &Config, campaign: &str, deep: bool, format: Format) -> Result<()> {
    let a = commands::audit(cfg, campaign, deep).await.context("audit")?;
    if format == Format::Json {
        println!("{}", serde_json::to_string_pretty(&a)?);
    } else {
        print!("{a}");
    }
    anyhow::ensure!(a.problems() == 0, "{} done job(s) have no audio object or not the one their row describes", a.problems());
    Ok(())
}

async fn calibrate(cfg: &Config, opts: &voxbatch::calibrate::CalibrateOptions, no_db: bool) -> Result<()> {
    println!("{:>6} {:>7} {:>8} {:>12} {:>11}", "batch", "tokens", "frames", "peak MiB", "latency ms");
    let (profile, path) = commands::calibrate(cfg, opts, !no_db, |p| {
        println!("{:>6} {:>7} {:>8} {:>12.1} {:>11.1}", p.batch, p.len_tokens, p.len_frames, p.peak_bytes as f64 / 1048576.0, p.latency_ms);
    })
    .await
    .context("calibrate")?;
    let f = &profile.fit;
    println!(
        "fit: peak(B, L) = {:.3} GiB + B·({:.1}·L + {:.4}·L²) bytes, L = longest output in frames\n     R² = {:.5}, worst error = {:.2}% of the largest peak ({:.2}% of its own peak) over {} points",
        f.model.m0 / (1u64 << 30) as f64,
        f.model.a,
        f.model.b,
        f.r2,
        f.worst_error_of_max_peak * 100.0,
        f.worst_rel_error * 100.0,
        profile.points.len()
    );
    println!("profile for {} on {} {}: {}{}", profile.model, profile.gpu, profile.precision, path.display(), if no_db { "" } else { " (and table calibrations)" });
    Ok(())
}

fn print_written(paths: &[PathBuf]) {
    for p in paths {
        println!("wrote {}", p.display());
    }
}

fn parse_precisions(list: &[String]) -> Result<Vec<voxbatch::model::Precision>> {
    list.iter().map(|p| p.parse().context("--precisions")).collect()
}

async fn bench(cfg: &mut Config, args: BenchArgs) -> Result<()> {
    match args.command {
        None => {
            let sweet = args.sweet;
            sweet.model.apply(cfg)?;
            let opts = voxbatch::bench::sweetspot::SweetSpotOptions {
                model_dir: cfg.model.dir.clone(),
                device: cfg.model.device,
                precisions: parse_precisions(&sweet.precisions)?,
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
            let pb = ProgressBar::new_spinner();
            pb.enable_steady_tick(std::time::Duration::from_millis(200));
            let (report, paths) = commands::bench_sweetspot(&opts, &sweet.out, |line| {
                pb.set_message(line.to_string());
                pb.suspend(|| eprintln!("  {line}"));
            })
            .await
            .context("sweet-spot bench")?;
            pb.finish_and_clear();
            println!("{}", voxbatch::bench::sweetspot::markdown(&report));
            print_written(&paths);
        }
        Some(BenchCommand::Token2wav {
            model,
            device,
            precisions,
            vocoders,
            batches,
            utterance_seconds,
            repeats,
            cudnn_benchmark,
            profile,
            flow_graphs,
            flow_graph_max_frames,
            out,
        }) => {
            let opts = voxbatch::bench::token2wav::Token2WavBenchOptions {
                model_dir: model,
                device: device.parse().context("--device")?,
                precisions: parse_precisions(&precisions)?,
                vocoders: parse_precisions(&vocoders)?,
                batches,
                utterance_seconds,
                repeats: repeats.max(1),
                cudnn_benchmark,
                profile,
                flow_graphs: voxbatch::model::flow_graphs::FlowGraphSettings { graphs: flow_graphs, max_frames: flow_graph_max_frames.max(1) },
                seed: 7,
            };
            let (report, paths) = commands::bench_token2wav(opts, &out, |p| {
                let error = p.error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default();
                eprintln!("  flow {} HiFT {} batch {}: {:.1} audio-s/s{error}", p.precision, p.vocoder, p.batch, p.audio_seconds_per_second)
            })
            .await
            .context("token2wav bench")?;
            println!("{}", voxbatch::bench::token2wav::table(&report));
            print_written(&paths);
        }
        Some(BenchCommand::Llm { model, device, slots, requests_per_slot, min_requests, no_graphs, reference, out }) => {
            let reference = match reference {
                Some(path) => {
                    let bytes = tokio::fs::read(&path).await.with_context(|| format!("read {}", path.display()))?;
                    Some(serde_json::from_slice(&bytes).with_context(|| format!("{}: not a reference run", path.display()))?)
                }
                None => None,
            };
            let opts = voxbatch::bench::llm::LlmBenchOptions {
                model_dir: model,
                device: device.parse().context("--device")?,
                slots,
                requests_per_slot,
                min_requests,
                graphs: !no_graphs,
                seed: 11,
                reference,
            };
            let (report, paths) = commands::bench_llm(opts, &out, |p| {
                let error = p.error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default();
                eprintln!("  {} slots: {:.0} tokens/s, {:.1} audio-s/s{error}", p.slots, p.tokens_per_second, p.audio_seconds_per_second)
            })
            .await
            .context("llm bench")?;
            println!("{}", voxbatch::bench::llm::table(&report));
            print_written(&paths);
        }
        Some(BenchCommand::Corpus { jobs, seed }) => {
            for line in commands::bench_corpus(jobs, seed) {
                println!("{line}");
            }
        }
        Some(BenchCommand::Policy { model, jobs, seed, vram_fraction, out, policy_only }) => {
            model.apply(cfg)?;
            if let Some(f) = vram_fraction {
                cfg.memory.vram_fraction = f;
            }
            let (report, paths) = commands::bench_policy(cfg, jobs, seed, policy_only, &out, |r| {
                eprintln!("  {}: {:.1} audio-s/s, {} OOM, peak {:.2} GiB", r.config, r.audio_seconds_per_second, r.ooms, r.peak_memory_bytes as f64 / (1u64 << 30) as f64);
            })
            .await
            .context("bench policy")?;
            println!("{}", voxbatch::bench::policy::table(&report));
            print_written(&paths);
        }
    }
    Ok(())
}

async fn demo(cfg: &Config, corpus: &Path, campaign: &str) -> Result<()> {
    let d = commands::demo(cfg, corpus, campaign, shutdown_signal()).await.context("demo")?;
    println!("enqueued {} job(s) (jobs of an earlier demo run are acked as already done)", d.enqueued);
    println!(
        "worker drained the queue: {} batch(es), {} job(s), {:.1} s of audio",
        d.worker.batches, d.worker.jobs_done, d.worker.audio_seconds
    );
    println!("{}", report::render(&d.report, Format::Table));
    println!("audio: {} file(s) under {}", d.audio_urls.len(), d.audio_prefix);
    for url in d.audio_urls.iter().take(3) {
        println!("  {url}");
    }
    // The bundled models have random weights (no weights can be downloaded): say so.
    if cfg.model.dir.ends_with("cosyvoice2-tiny") {
        println!("(cosyvoice2-tiny has random weights: its audio is noise of the right length, not speech; convert your CosyVoice2 checkpoint for speech)");
    } else if cfg.model.dir.file_name().is_some_and(|n| n.to_string_lossy().starts_with("reference-")) {
        println!("(the reference model's audio is not speech: it has the compute shape of a TTS network, random weights)");
    }
    Ok(())
}

async fn campaign_status(cfg: &Config, campaign: &str, watch: bool, window: std::time::Duration, format: Format) -> Result<()> {
    if !watch {
        let progress = commands::campaign_progress(cfg, campaign, window).await.context("status")?;
        match format {
            Format::Json => println!("{}", serde_json::to_string_pretty(&progress)?),
            _ => print!("{}", progress.text()),
        }
        return Ok(());
    }
    // One connection for the whole watch.
    let db = commands::open_db(cfg).await.context("status")?;
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{wide_bar} {pos}/{len} settled\n{msg}").unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    loop {
        let progress = commands::CampaignProgress::read(&db, campaign, window).await.context("status")?;
        bar.set_length(progress.total_jobs.max(0) as u64);
        bar.set_position(progress.figures.finished_jobs.max(0) as u64);
        bar.set_message(progress.text());
        if progress.finished() {
            bar.finish();
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
}

async fn dead(cfg: &Config, command: DeadCommand) -> Result<()> {
    let (select, action, format) = match command {
        DeadCommand::List { select, format } => (select, commands::DeadAction::List, format),
        DeadCommand::Requeue { select, dry_run, format } => (select, commands::DeadAction::Requeue { dry_run }, format),
        DeadCommand::Purge { select, yes, format } => {
            if !yes {
                anyhow::bail!("dead purge removes messages for good: add --yes (try `voxbatch dead list` with the same filters first)");
            }
            (select, commands::DeadAction::Purge, format)
        }
    };
    let filter = commands::DeadFilter { campaign: select.campaign, code: select.code, limit: select.limit };
    let report = commands::dead(cfg, &filter, action).await.context("dead")?;
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        _ => print!("{}", commands::dead_table(&report)),
    }
    Ok(())
}

async fn voice(cfg: &Config, command: VoiceCommand) -> Result<()> {
    let dir = |model: Option<std::path::PathBuf>| model.unwrap_or_else(|| cfg.model.dir.clone());
    match command {
        VoiceCommand::Add { name, audio, text, model, replace, format } => {
            let add = commands::VoiceAdd { name, audio, text, model_dir: dir(model), replace };
            let added = commands::voice_add(cfg, &add).await.context("voice add")?;
            match format {
                Format::Json => println!("{}", serde_json::to_string_pretty(&added)?),
                _ => println!(
                    "{} voice {} for model {}: {:.1} s of prompt ({} speech tokens, {} transcript tokens) from {:.1} s of recording (sha256 {})",
                    if added.replaced { "replaced" } else { "added" },
                    added.name,
                    added.model,
                    added.prompt_seconds,
                    added.prompt_speech_tokens,
                    added.prompt_text_tokens,
                    added.recording_seconds,
                    &added.sha256[..12]
                ),
            }
        }
        VoiceCommand::List { model, all, format } => {
            let model_dir = (!all).then(|| dir(model));
            let voices = commands::voice_list(cfg, model_dir.as_deref()).await.context("voice list")?;
            match format {
                Format::Json => println!("{}", serde_json::to_string_pretty(&voices)?),
                _ => print!("{}", commands::voice_table(&voices)),
            }
        }
        VoiceCommand::Show { name, model } => {
            let v = commands::voice_show(cfg, &dir(model), &name).await.context("voice show")?;
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        VoiceCommand::Rm { name, model } => {
            let model_dir = dir(model);
            commands::voice_rm(cfg, &model_dir, &name).await.context("voice rm")?;
            println!("removed voice {name}; running workers forget it within [voices] refresh");
        }
    }
    Ok(())
}
