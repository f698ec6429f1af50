//! Where the command line's logs go: standard error, text or JSON (`--log-format`), levels from
//! RUST_LOG. `main.rs` calls [`init_logging`] once, before any command runs.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Logs to standard error. symphonia (`voice add`'s decoding) logs through `log` the probe
/// failures `voice add` reports itself, in its own words: off unless RUST_LOG names it.
pub fn init_logging(format: &str) {
    let env = std::env::var("RUST_LOG").ok();
    let mut filter = env.as_deref().and_then(|f| EnvFilter::try_new(f).ok()).unwrap_or_else(|| EnvFilter::new("info,sqlx=warn,lapin=warn,aws=warn"));
    if !env.as_deref().is_some_and(|f| f.contains("symphonia")) {
        filter = filter.add_directive("symphonia=off".parse().expect("a valid directive"));
    }
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(std::io::stderr().is_terminal());
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}
