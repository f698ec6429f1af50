//! `voxbatch report`: throughput and cost from Postgres, optionally with a chart.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};

use super::{io, CommandError};
use crate::config::Config;
use crate::db::Db;
use crate::report::{self, Dimension, Report};

/// The report for `by`, `since`, `campaign`.
pub async fn report(cfg: &Config, by: Dimension, since: Option<DateTime<Utc>>, campaign: Option<&str>) -> Result<Report, CommandError> {
    let db = Db::connect(&cfg.database).await?;
    Ok(report::report(&db, by, since, campaign).await?)
}

/// Writes the report's chart to `path`: SVG or PNG by its extension.
pub async fn write_plot(r: &Report, path: &Path) -> Result<PathBuf, CommandError> {
    let svg = report::plot(r);
    let bytes = match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("svg") => svg.into_bytes(),
        Some("png") => crate::plot::png(&svg, 2.0)?,
        _ => return Err(CommandError::Usage("--plot writes SVG or PNG: name the file .svg or .png".into())),
    };
    tokio::fs::write(path, bytes).await.map_err(io("write the plot"))?;
    Ok(path.to_path_buf())
}
