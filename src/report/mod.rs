//! Reports: what was synthesized, how fast, per campaign (first version: jobs, audio hours,
//! batches, real-time factor; cost and GPU columns come with the metrics work).
//!
//! Input: the `jobs` and `batches` tables. Output: rows rendered as a table, CSV or JSON.
//! A batch can mix campaigns: its inference time is shared among its jobs by audio duration.
//!
//! Neighbours: `db` owns the tables; `main.rs` prints what [`render`] returns.

use std::fmt::Write as _;
use std::str::FromStr;

use serde::Serialize;
use sqlx::Row;

use crate::db::{Db, DbError};

/// Output formats of `voxbatch report`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Csv,
    Json,
}

impl FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "table" => Ok(Format::Table),
            "csv" => Ok(Format::Csv),
            "json" => Ok(Format::Json),
            other => Err(format!("`{other}` is not a format: use table, csv or json")),
        }
    }
}

/// One campaign's figures (or the total, with campaign "TOTAL").
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ReportRow {
    pub campaign: String,
    pub jobs: i64,
    pub done: i64,
    pub failed: i64,
    pub rejected: i64,
    pub pending: i64,
    pub chars: i64,
    pub audio_hours: f64,
    pub batches: i64,
    /// Inference seconds (this campaign's share of its batches).
    pub infer_seconds: f64,
    /// Inference time / audio time: below 1 is faster than real time.
    pub real_time_factor: Option<f64>,
    /// Audio seconds per inference second (1 / RTF).
    pub audio_seconds_per_second: Option<f64>,
}

const QUERY: &str = "
WITH per_job AS (
    SELECT j.campaign, j.status, j.chars, j.audio_seconds, j.batch_id,
           CASE WHEN j.status = 'done' AND b.audio_seconds > 0
                THEN b.infer_ms * j.audio_seconds / b.audio_seconds END AS infer_ms_share
    FROM jobs j LEFT JOIN batches b ON b.batch_id = j.batch_id
    WHERE ($1::text IS NULL OR j.campaign = $1)
)
SELECT campaign,
       count(*)::bigint AS jobs,
       count(*) FILTER (WHERE status = 'done')::bigint AS done,
       count(*) FILTER (WHERE status = 'failed')::bigint AS failed,
       count(*) FILTER (WHERE status = 'rejected')::bigint AS rejected,
       count(*) FILTER (WHERE status IN ('queued', 'running'))::bigint AS pending,
       coalesce(sum(chars) FILTER (WHERE status = 'done'), 0)::bigint AS chars,
       coalesce(sum(audio_seconds) FILTER (WHERE status = 'done'), 0)::float8 AS audio_seconds,
       count(DISTINCT batch_id)::bigint AS batches,
       coalesce(sum(infer_ms_share), 0)::float8 / 1000.0 AS infer_seconds
FROM per_job
GROUP BY GROUPING SETS ((campaign), ())
ORDER BY campaign NULLS LAST";

/// Per-campaign rows and a total row (last), optionally for one campaign.
pub async fn campaign_report(db: &Db, campaign: Option<&str>) -> Result<Vec<ReportRow>, DbError> {
    let rows = sqlx::query(QUERY)
        .bind(campaign)
        .fetch_all(db.pool())
        .await
        .map_err(|source| DbError::Query { context: "campaign report", source })?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let audio_seconds: f64 = r.get("audio_seconds");
            let infer_seconds: f64 = r.get("infer_seconds");
            let name: Option<String> = r.get("campaign");
            ReportRow {
                campaign: name.unwrap_or_else(|| "TOTAL".to_string()),
                jobs: r.get("jobs"),
                done: r.get("done"),
                failed: r.get("failed"),
                rejected: r.get("rejected"),
                pending: r.get("pending"),
                chars: r.get("chars"),
                audio_hours: audio_seconds / 3600.0,
                batches: r.get("batches"),
                infer_seconds,
                real_time_factor: (audio_seconds > 0.0).then(|| infer_seconds / audio_seconds),
                audio_seconds_per_second: (infer_seconds > 0.0).then(|| audio_seconds / infer_seconds),
            }
        })
        .filter(|row| row.jobs > 0)
        .collect())
}

const HEADERS: [&str; 12] = [
    "campaign", "jobs", "done", "failed", "rejected", "pending", "chars", "audio_hours", "batches", "infer_seconds",
    "real_time_factor", "audio_s_per_s",
];

fn cells(r: &ReportRow) -> [String; 12] {
    let opt = |v: Option<f64>, p: usize| v.map(|v| format!("{v:.p$}")).unwrap_or_else(|| "-".into());
    [
        r.campaign.clone(),
        r.jobs.to_string(),
        r.done.to_string(),
        r.failed.to_string(),
        r.rejected.to_string(),
        r.pending.to_string(),
        r.chars.to_string(),
        format!("{:.4}", r.audio_hours),
        r.batches.to_string(),
        format!("{:.2}", r.infer_seconds),
        opt(r.real_time_factor, 4),
        opt(r.audio_seconds_per_second, 1),
    ]
}

/// Renders rows in `format`.
pub fn render(rows: &[ReportRow], format: Format) -> String {
    match format {
        Format::Json => serde_json::to_string_pretty(rows).unwrap_or_default(),
        Format::Csv => {
            let mut out = HEADERS.join(",");
            out.push('\n');
            for r in rows {
                let line: Vec<String> = cells(r)
                    .into_iter()
                    .map(|c| if c.contains([',', '"', '\n']) { format!("\"{}\"", c.replace('"', "\"\"")) } else { c })
                    .collect();
                let _ = writeln!(out, "{}", line.join(","));
            }
            out
        }
        Format::Table => {
            let mut t = comfy_table::Table::new();
            t.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED);
            t.set_header(HEADERS);
            for r in rows {
                t.add_row(cells(r));
            }
            t.to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str) -> ReportRow {
        ReportRow {
            campaign: name.into(),
            jobs: 3,
            done: 2,
            failed: 1,
            rejected: 0,
            pending: 0,
            chars: 120,
            audio_hours: 0.01,
            batches: 1,
            infer_seconds: 3.6,
            real_time_factor: Some(0.1),
            audio_seconds_per_second: Some(10.0),
        }
    }

    #[test]
    fn csv_quotes_fields_and_json_round_trips() {
        let rows = vec![row("a,b"), row("TOTAL")];
        let csv = render(&rows, Format::Csv);
        assert!(csv.starts_with("campaign,jobs,"));
        assert!(csv.contains("\"a,b\",3,2,1,0,0,120,0.0100,1,3.60,0.1000,10.0"), "{csv}");
        let json: serde_json::Value = serde_json::from_str(&render(&rows, Format::Json)).unwrap();
        assert_eq!(json[1]["campaign"], "TOTAL");
        assert!(render(&rows, Format::Table).contains("TOTAL"));
    }
}
