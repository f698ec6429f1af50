//! The commands that show progress while they run — `status --watch` (a redrawn bar on a terminal,
//! a line or JSON object per refresh elsewhere), `enqueue` (a publishing bar, and the exact resume
//! command when interrupted) and `bench` (a spinner with each step) — around what
//! `voxbatch::commands` does. `main.rs` dispatches to them; [`emit`] prints any result.

use std::io::IsTerminal;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use voxbatch::commands::{self, CommandError};
use voxbatch::config::Config;
use voxbatch::enqueue::LineDefaults;
use voxbatch::report::{render, Format, Render};

/// Prints `value` in `format`.
pub fn emit<T: Render + ?Sized>(value: &T, format: Format) -> Result<()> {
    print!("{}", render(value, format)?);
    Ok(())
}

fn bar(template: &str) -> ProgressBar {
    let pb = ProgressBar::new(0);
    pb.set_style(ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()));
    pb
}

/// `status --campaign C --watch`: on a terminal a redrawn bar; otherwise (a file, a pipe) one
/// line per refresh, or one JSON object per line.
pub async fn watch(cfg: &Config, campaign: &str, window: std::time::Duration, every: std::time::Duration, format: Format) -> Result<()> {
    anyhow::ensure!(format != Format::Csv, "status --watch prints table or json");
    let tty = std::io::stdout().is_terminal() && format == Format::Table;
    let pb = bar("{wide_bar} {pos}/{len} settled\n{msg}");
    pb.set_draw_target(if tty { indicatif::ProgressDrawTarget::stdout() } else { indicatif::ProgressDrawTarget::hidden() });
    commands::watch_campaign(cfg, campaign, window, every, |p| match (tty, format) {
        (true, _) => {
            pb.set_length(p.total_jobs.max(0) as u64);
            pb.set_position(p.figures.finished_jobs.max(0) as u64);
            pb.set_message(p.text());
        }
        (false, Format::Json) => print!("{}", voxbatch::report::output::json_line(p)),
        (false, _) => print!("{}", p.line()),
    })
    .await
    .context("status")?;
    pb.finish();
    Ok(())
}

pub async fn enqueue(cfg: &Config, file: &std::path::Path, defaults: &LineDefaults, skip: usize, format: Format) -> Result<()> {
    let pb = bar("{spinner} publishing [{bar:40}] {pos}/{len} ({per_sec}, eta {eta})");
    let progress = |total: usize, done: usize| {
        pb.set_length(total as u64);
        pb.set_position(done as u64);
    };
    // An interrupted run is resumed by this very command with --skip (every flag matters: the
    // campaign and voice are part of the derived ids).
    let args: Vec<String> = std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect();
    let mut s = match commands::enqueue(cfg, file, defaults, skip, commands::shutdown_signal(), progress).await {
        Ok(s) => s,
        Err(e @ CommandError::EnqueueStopped { published, .. }) => {
            pb.finish_and_clear();
            let resume = voxbatch::enqueue::resume_command(&args, published);
            return Err(anyhow::Error::new(e).context(format!("enqueue {}; once it can publish, resume with `{resume}`", file.display())));
        }
        Err(e) => return Err(e).with_context(|| format!("enqueue {}", file.display())),
    };
    pb.finish_and_clear();
    s.resume_command = s.interrupted.then(|| voxbatch::enqueue::resume_command(&args, s.published()));
    emit(&s, format)?;
    if s.interrupted {
        eprint!("{}", s.interrupted_text());
        std::process::exit(130);
    }
    Ok(())
}

pub async fn bench(cfg: &Config, run: commands::BenchRun) -> Result<()> {
    let pb = ProgressBar::new_spinner();
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
    let shown = pb.clone();
    let (table, paths) = commands::bench(cfg, run, move |line| {
        shown.set_message(line.to_string());
        shown.suspend(|| eprintln!("  {line}"));
    })
    .await
    .context("bench")?;
    pb.finish_and_clear();
    println!("{table}");
    print!("{}", commands::written_text(&paths));
    Ok(())
}
