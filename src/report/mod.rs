//! Reports: what was synthesized, how fast, and what it cost, grouped by campaign, day, batch
//! size, precision, GPU or model, as a table, CSV or JSON, optionally with an SVG chart.
//!
//! Input: the SQL function `cost_by(dimension, since, campaign)` and the view
//! `worker_utilisation` (migrations/…_cost.sql), which analysts can also query with psql. A batch
//! can mix campaigns: its inference time, cost and energy are shared among its jobs by audio length.
//!
//! Hours and throughput are of the devices that ran the batches: a report of CPU workers says
//! `cpu_hours`, of GPUs `gpu_hours`, of both `device_hours` ([`Devices`]; the JSON keeps the
//! field names `gpu_hours` and `audio_s_per_gpu_s` and says which in `devices`).
//!
//! [`output`]: how every command renders its results (one table style, CSV, JSON).
//!
//! Neighbours: `db` owns the tables; `commands::report` runs it; `plot` draws its chart;
//! `main.rs` prints what [`render`] returns.

pub mod output;

use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::Row;

use crate::db::{Db, DbError};
pub use output::{render, Format, Render, Table};

/// A value `report` does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{value}`: use {expected}")]
pub struct ParseError {
    pub value: String,
    pub expected: &'static str,
}

/// What rows are grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dimension {
    Campaign,
    Day,
    BatchSize,
    Precision,
    Gpu,
    Model,
    /// CosyVoice2's stages (`llm`, `token2wav`): each stage's GPU time and cost over the jobs it
    /// served (from `batch_stages`).
    Stage,
}

impl Dimension {
    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::Campaign => "campaign",
            Dimension::Day => "day",
            Dimension::BatchSize => "batch_size",
            Dimension::Precision => "precision",
            Dimension::Gpu => "gpu",
            Dimension::Model => "model",
            Dimension::Stage => "stage",
        }
    }
}

impl FromStr for Dimension {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        Ok(match s {
            "campaign" => Dimension::Campaign,
            "day" => Dimension::Day,
            "batch_size" | "batch-size" => Dimension::BatchSize,
            "precision" => Dimension::Precision,
            "gpu" => Dimension::Gpu,
            "model" => Dimension::Model,
            "stage" => Dimension::Stage,
            other => return Err(ParseError { value: other.to_string(), expected: "campaign, day, batch_size, precision, gpu, model or stage" }),
        })
    }
}

/// One group's figures (the last row of a report is the total, key "TOTAL").
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ReportRow {
    pub key: String,
    pub jobs: i64,
    pub chars: i64,
    pub audio_hours: f64,
    pub gpu_hours: f64,
    /// Inference time / audio time (below 1 is faster than real time).
    pub real_time_factor: Option<f64>,
    pub audio_s_per_gpu_s: Option<f64>,
    pub cost_usd: Option<f64>,
    pub usd_per_audio_hour: Option<f64>,
    pub usd_per_million_chars: Option<f64>,
    /// NVML utilisation during inference, percent (weighted by inference time).
    pub gpu_util_mean: Option<f64>,
    pub energy_kwh: Option<f64>,
}

/// Workers' busy and idle time over the report's window.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct IdleSummary {
    pub workers: i64,
    pub busy_hours: f64,
    pub idle_hours: f64,
    /// busy / (busy + idle)
    pub utilisation: Option<f64>,
    pub cost_usd: f64,
    pub idle_cost_usd: f64,
}

/// What ran a report's batches: its hours and throughput are of these devices.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Devices {
    Gpu,
    Cpu,
    /// GPUs and CPUs, or no batch at all.
    Mixed,
}

impl Devices {
    /// The word for their hours and seconds in column names: `gpu`, `cpu`, `device`.
    pub fn word(self) -> &'static str {
        match self {
            Devices::Gpu => "gpu",
            Devices::Cpu => "cpu",
            Devices::Mixed => "device",
        }
    }

    fn of(cpu: Option<bool>, gpu: Option<bool>) -> Devices {
        match (cpu.unwrap_or(false), gpu.unwrap_or(false)) {
            (true, false) => Devices::Cpu,
            (false, true) => Devices::Gpu,
            _ => Devices::Mixed,
        }
    }
}

/// A report: rows, total, and the workers' idle time.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    pub by: String,
    /// What ran the batches: `gpu_hours` and `audio_s_per_gpu_s` are of these devices.
    pub devices: Devices,
    pub rows: Vec<ReportRow>,
    pub total: Option<ReportRow>,
    pub workers: IdleSummary,
    /// From the first batch's start to the last batch's end in the window (wall time of the work).
    pub batch_span_seconds: Option<f64>,
    /// What the report covers: the campaign filter and the time range of its batches.
    pub scope: String,
}

async fn rows(db: &Db, dimension: &str, since: Option<DateTime<Utc>>, campaign: Option<&str>) -> Result<Vec<ReportRow>, DbError> {
    let rows = sqlx::query("SELECT * FROM cost_by($1, coalesce($2, '-infinity'::timestamptz), $3)")
        .bind(dimension)
        .bind(since)
        .bind(campaign)
        .fetch_all(db.pool())
        .await
        .map_err(|source| DbError::Query { context: "report", source })?;
    Ok(rows
        .into_iter()
        .map(|r| ReportRow {
            key: r.get::<Option<String>, _>("key").unwrap_or_default(),
            jobs: r.get("jobs"),
            chars: r.get::<Option<i64>, _>("chars").unwrap_or(0),
            audio_hours: r.get::<Option<f64>, _>("audio_hours").unwrap_or(0.0),
            gpu_hours: r.get::<Option<f64>, _>("gpu_hours").unwrap_or(0.0),
            real_time_factor: r.get("real_time_factor"),
            audio_s_per_gpu_s: r.get("audio_s_per_gpu_s"),
            cost_usd: r.get("cost_usd"),
            usd_per_audio_hour: r.get("usd_per_audio_hour"),
            usd_per_million_chars: r.get("usd_per_million_chars"),
            gpu_util_mean: r.get("gpu_util_mean"),
            energy_kwh: r.get("energy_kwh"),
        })
        .collect())
}

/// Builds the report grouped by `by`, for jobs finished since `since`, optionally one campaign.
pub async fn report(db: &Db, by: Dimension, since: Option<DateTime<Utc>>, campaign: Option<&str>) -> Result<Report, DbError> {
    let grouped = rows(db, by.as_str(), since, campaign).await?;
    let total = rows(db, "total", since, campaign).await?.into_iter().next();
    let w = sqlx::query(
        "SELECT count(*) AS workers, coalesce(sum(busy_hours), 0) AS busy, coalesce(sum(idle_hours), 0) AS idle,
                coalesce(sum(cost_usd), 0) AS cost, coalesce(sum(idle_cost_usd), 0) AS idle_cost
         FROM worker_utilisation WHERE coalesce(stopped_at, last_heartbeat) >= coalesce($1, '-infinity'::timestamptz)",
    )
    .bind(since)
    .fetch_one(db.pool())
    .await
    .map_err(|source| DbError::Query { context: "worker utilisation", source })?;
    let (busy, idle): (f64, f64) = (w.get("busy"), w.get("idle"));
    // The window's batches: first start and last end (the work's wall time, and the chart's
    // range), and whether CPUs, GPUs or both ran them.
    let (first, last, cpu, gpu): (Option<DateTime<Utc>>, Option<DateTime<Utc>>, Option<bool>, Option<bool>) = sqlx::query_as(
        "SELECT min(b.started_at), max(b.finished_at), bool_or(b.device = 'cpu'), bool_or(b.device <> 'cpu') FROM batches b
         WHERE b.finished_at >= coalesce($1, '-infinity'::timestamptz)
           AND ($2::text IS NULL OR EXISTS (SELECT 1 FROM jobs j WHERE j.batch_id = b.batch_id AND j.campaign = $2))",
    )
    .bind(since)
    .bind(campaign)
    .fetch_one(db.pool())
    .await
    .map_err(|source| DbError::Query { context: "batch span", source })?;
    let span = first.zip(last).map(|(a, b)| (b - a).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6);
    let range = match (first, last) {
        (Some(a), Some(b)) => format!("batches {} to {} UTC", a.format("%Y-%m-%d %H:%M"), b.format("%Y-%m-%d %H:%M")),
        _ => "no batches".to_string(),
    };
    let scope = format!("{}; {range}", campaign.map(|c| format!("campaign {c}")).unwrap_or_else(|| "all campaigns".into()));
    Ok(Report {
        scope,
        by: by.as_str().to_string(),
        devices: Devices::of(cpu, gpu),
        rows: grouped,
        total,
        workers: IdleSummary {
            workers: w.get("workers"),
            busy_hours: busy,
            idle_hours: idle,
            utilisation: (busy + idle > 0.0).then(|| busy / (busy + idle)),
            cost_usd: w.get("cost"),
            idle_cost_usd: w.get("idle_cost"),
        },
        batch_span_seconds: span,
    })
}

fn headers(by: &str, devices: Devices) -> [String; 12] {
    let d = devices.word();
    [
        by.to_string(),
        "jobs".into(),
        "chars".into(),
        "audio_hours".into(),
        format!("{d}_hours"),
        "real_time_factor".into(),
        format!("audio_s_per_{d}_s"),
        "cost_usd".into(),
        "usd_per_audio_hour".into(),
        "usd_per_million_chars".into(),
        "gpu_util_pct".into(),
        "energy_kwh".into(),
    ]
}

fn cells(r: &ReportRow) -> [String; 12] {
    let opt = |v: Option<f64>, p: usize| v.map(|v| format!("{v:.p$}")).unwrap_or_else(|| "-".into());
    [
        r.key.clone(),
        r.jobs.to_string(),
        r.chars.to_string(),
        format!("{:.4}", r.audio_hours),
        format!("{:.4}", r.gpu_hours),
        opt(r.real_time_factor, 5),
        opt(r.audio_s_per_gpu_s, 1),
        opt(r.cost_usd, 4),
        opt(r.usd_per_audio_hour, 4),
        opt(r.usd_per_million_chars, 2),
        opt(r.gpu_util_mean, 1),
        opt(r.energy_kwh, 4),
    ]
}

impl Report {
    /// Its rows and total as one [`Table`].
    pub fn table(&self) -> Table {
        let mut t = Table::new(headers(&self.by, self.devices));
        for r in self.rows.iter().chain(self.total.iter()) {
            t.row(cells(r));
        }
        t
    }
}

impl Render for Report {
    fn text(&self) -> String {
        let w = &self.workers;
        format!(
            "{}\n{}workers: {}, busy {:.3} h, idle {:.3} h, utilisation {}, cost ${:.4} (idle ${:.4})\n",
            crate::job::escape_controls(&self.scope),
            self.table(),
            w.workers,
            w.busy_hours,
            w.idle_hours,
            w.utilisation.map(|u| format!("{:.1}%", u * 100.0)).unwrap_or_else(|| "-".into()),
            w.cost_usd,
            w.idle_cost_usd
        )
    }

    fn csv(&self) -> Option<String> {
        Some(self.table().csv())
    }
}

/// "GPU", "CPU" or "device": what the report's seconds are of, for people.
fn self_word(report: &Report) -> &'static str {
    match report.devices {
        Devices::Gpu => "GPU",
        Devices::Cpu => "CPU",
        Devices::Mixed => "device",
    }
}

/// An SVG bar chart of $ per audio hour and audio-seconds per device-second by key: titles, axis
/// names with units, values on the bars, and what the report covers.
pub fn plot(report: &Report) -> String {
    use crate::plot::BarPanel;
    let labels: Vec<String> = report.rows.iter().map(|r| r.key.clone()).collect();
    let cost: Vec<f64> = report.rows.iter().map(|r| r.usd_per_audio_hour.unwrap_or(0.0)).collect();
    let speed: Vec<f64> = report.rows.iter().map(|r| r.audio_s_per_gpu_s.unwrap_or(0.0)).collect();
    crate::plot::bars(
        &[
            BarPanel { title: "Cost per audio hour".into(), unit: "US$ per audio hour".into(), values: cost },
            BarPanel { title: "Throughput".into(), unit: format!("audio-seconds per {}-second", self_word(report)), values: speed },
        ],
        &labels,
        &report.by,
        &report.scope,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str) -> ReportRow {
        ReportRow {
            key: key.into(),
            jobs: 3,
            chars: 120,
            audio_hours: 0.01,
            gpu_hours: 0.001,
            real_time_factor: Some(0.1),
            audio_s_per_gpu_s: Some(10.0),
            cost_usd: Some(0.004),
            usd_per_audio_hour: Some(0.4),
            usd_per_million_chars: Some(33.33),
            gpu_util_mean: None,
            energy_kwh: None,
        }
    }

    #[test]
    fn csv_quotes_fields_and_json_round_trips() {
        let report = Report {
            by: "campaign".into(),
            devices: Devices::Gpu,
            rows: vec![row("a,b")],
            total: Some(row("TOTAL")),
            workers: IdleSummary { workers: 1, busy_hours: 1.0, idle_hours: 1.0, utilisation: Some(0.5), cost_usd: 8.0, idle_cost_usd: 4.0 },
            batch_span_seconds: Some(10.0),
            scope: "campaign a,b; batches 2026-12-01 10:00 to 2026-12-01 11:00 UTC".into(),
        };
        let render = |f| render(&report, f).unwrap();
        let csv = render(Format::Csv);
        assert!(csv.starts_with("campaign,jobs,chars,"));
        assert!(csv.contains("\"a,b\",3,120,0.0100,0.0010,0.10000,10.0,0.0040,0.4000,33.33,-,-"), "{csv}");
        let json: serde_json::Value = serde_json::from_str(&render(Format::Json)).unwrap();
        assert_eq!(json["total"]["key"], "TOTAL");
        let table = render(Format::Table);
        assert!(table.contains("TOTAL") && table.contains("utilisation 50.0%") && table.contains("idle $4.0000"), "{table}");
        assert!(table.contains("gpu_hours") && table.contains("audio_s_per_gpu_s"), "{table}");
        let cpu = Report { devices: Devices::Cpu, ..report.clone() };
        let cpu_table = cpu.text();
        assert!(cpu_table.contains("cpu_hours") && cpu_table.contains("audio_s_per_cpu_s") && !cpu_table.contains("gpu_hours"), "{cpu_table}");
        assert!(plot(&cpu).contains("audio-seconds per CPU-second"));
        assert_eq!(serde_json::to_value(&cpu).unwrap()["devices"], "cpu");
        let chart = plot(&report);
        assert!(chart.contains("<svg") && chart.contains("US$ per audio hour") && chart.contains("2026-12-01 10:00"), "{chart}");
        assert!("batch-size".parse::<Dimension>().is_ok() && "nope".parse::<Dimension>().is_err());
    }
}
