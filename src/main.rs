//! `voxbatch`: the command line. Parses flags (`cli`), sets up logging (`cli::logging`), calls
//! `voxbatch::commands` and prints what they return: each result renders itself
//! (`voxbatch::report::Render`); the commands with a progress display are in `cli::progress`.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use clap::Parser;

use voxbatch::commands;
use voxbatch::config::Config;
use voxbatch::enqueue::LineDefaults;

mod cli;
use cli::logging::init_logging;
use cli::progress::{bench, emit, enqueue, watch};
use cli::{Cli, Command, VoiceCommand};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line with the whole chain, then what to check when the cause is permanent.
            eprintln!("error: {e:#}");
            if let Some(hint) = e.chain().find_map(commands::hint) {
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
        Command::Enqueue { file, campaign, voice, speed, skip, format } => enqueue(&cfg, &file, &LineDefaults { campaign, voice, speed }, skip, format).await?,
        Command::Work(args) => work(&mut cfg, args).await?,
        Command::Status { campaign: None, format, .. } => emit(&commands::status(&cfg).await.context("status")?, format)?,
        Command::Status { campaign: Some(campaign), watch: false, window, format, .. } => {
            emit(&commands::campaign_progress(&cfg, &campaign, window).await.context("status")?, format)?
        }
        Command::Status { campaign: Some(campaign), watch: true, window, every, format } => watch(&cfg, &campaign, window, every, format).await?,
        Command::Voice { command } => voice(&cfg, command).await?,
        Command::Dead { command } => {
            let (filter, action, format) = command.parts()?;
            let report = commands::dead_until(&cfg, &filter, action, commands::shutdown_signal()).await.context("dead")?;
            emit(&report, format)?;
            if report.interrupted {
                std::process::exit(130);
            }
        }
        Command::Cancel { campaign, resume } => {
            let changed = commands::cancel(&cfg, &campaign, resume).await.context("cancel")?;
            print!("{}", commands::cancel_text(&campaign, resume, changed));
        }
        Command::Text { file, model, gpu, campaign, speed, format } => {
            let (dir, defaults, cfg2) = (model.unwrap_or_else(|| cfg.model.dir.clone()), LineDefaults { campaign, voice: None, speed }, cfg.clone());
            let report = tokio::task::spawn_blocking(move || commands::text_dry_run(&cfg2, &dir, &file, &defaults, &gpu)).await.context("text")??;
            emit(&report, format)?;
        }
        Command::Report { by, since, campaign, format, plot } => {
            let r = commands::report(&cfg, by, since, campaign.as_deref()).await.context("report")?;
            emit(&r, format)?;
            if let Some(path) = plot {
                eprintln!("wrote {}", commands::write_plot(&r, &path).await.context("plot")?.display());
            }
        }
        Command::Audit { campaign, deep, format } => {
            let a = commands::audit(&cfg, &campaign, deep).await.context("audit")?;
            emit(&a, format)?;
            anyhow::ensure!(a.problems() == 0, "{} done job(s) have no audio object or not the one their row describes", a.problems());
        }
        Command::Calibrate { model, vram_fraction, min_tokens, max_tokens, max_seconds, no_db } => {
            let opts = cli::calibrate_options(&mut cfg, &model, vram_fraction, min_tokens, max_tokens, max_seconds)?;
            print!("{}", commands::calibration_point_header());
            let (profile, path) = commands::calibrate(&cfg, &opts, !no_db, |p| print!("{}", commands::calibration_point_text(p))).await.context("calibrate")?;
            print!("{}", commands::calibrated_text(&profile, &path, !no_db));
        }
        Command::Bench(args) => {
            let run = args.into_run(&mut cfg)?;
            bench(&cfg, run).await?
        }
        Command::Demo { corpus, campaign, model } => {
            model.apply(&mut cfg)?;
            print!("{}", commands::demo(&cfg, &corpus, &campaign, commands::shutdown_signal()).await.context("demo")?);
        }
    }
    Ok(())
}

async fn work(cfg: &mut Config, args: cli::WorkArgs) -> Result<()> {
    let (opts, devices) = args.options(cfg)?;
    let mut serving = false;
    if let Some(addr) = cfg.metrics.listen {
        // An ops endpoint that cannot start (the port taken by another worker on this host) is
        // said loudly, but synthesis goes on.
        match voxbatch::metrics::serve(addr) {
            Ok(()) => serving = true,
            Err(e) => tracing::error!(error = %voxbatch::worker::error_chain(&e), "metrics not served; set metrics.listen to a free port or \"off\""),
        }
    }
    for s in commands::work(cfg, &devices, args.workers_per_device, opts, commands::shutdown_signal()).await.context("worker")? {
        print!("{}", commands::worker_text(&s));
    }
    // A drained worker's last batch must still be scraped: the endpoint stays up a while.
    if serving && args.drain && !cfg.metrics.linger.is_zero() {
        tracing::info!(linger_s = cfg.metrics.linger.as_secs_f64(), "queue drained; /metrics stays up for the last scrape");
        tokio::select! { _ = tokio::time::sleep(cfg.metrics.linger) => {}, _ = commands::shutdown_signal() => {} }
    }
    Ok(())
}

async fn voice(cfg: &Config, command: VoiceCommand) -> Result<()> {
    let dir = |model: Option<std::path::PathBuf>| model.unwrap_or_else(|| cfg.model.dir.clone());
    match command {
        VoiceCommand::Add { name, audio, text, model, replace, format } => {
            let add = commands::VoiceAdd { name, audio, text, model_dir: dir(model), replace };
            emit(&commands::voice_add(cfg, &add).await.context("voice add")?, format)
        }
        VoiceCommand::List { model, all, format } => {
            let model_dir = (!all).then(|| dir(model));
            emit(commands::voice_list(cfg, model_dir.as_deref()).await.context("voice list")?.as_slice(), format)
        }
        VoiceCommand::Show { name, model, format } => emit(&commands::voice_show(cfg, &dir(model), &name).await.context("voice show")?, format),
        VoiceCommand::Rm { name, model } => {
            commands::voice_rm(cfg, &dir(model), &name).await.context("voice rm")?;
            print!("{}", commands::voice_rm_text(&name));
            Ok(())
        }
    }
}
