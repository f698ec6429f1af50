//! The sweet-spot bench's report: Markdown, JSON and the SVG plot.

use super::{Point, SweetSpotReport};

fn gib(b: Option<u64>) -> String {
    b.map(|b| format!("{:.2}", b as f64 / (1u64 << 30) as f64)).unwrap_or_else(|| "-".into())
}

/// The report as Markdown.
pub fn markdown(r: &SweetSpotReport) -> String {
    let mut s = format!(
        "# Sweet-spot bench: {} on {} ({})\n\n{}; utterances of {:.1} s ({} tokens); ceiling {:.1} GiB of {:.1} GiB.\n\n",
        r.model,
        r.gpu,
        r.device,
        r.date,
        r.utterance_seconds,
        r.utterance_tokens,
        r.ceiling_bytes / (1u64 << 30) as f64,
        r.total_memory_bytes as f64 / (1u64 << 30) as f64
    );
    s.push_str("## 1. Baseline (batch 1, fp32)\n\n");
    if let Some(b) = &r.baseline {
        s.push_str(&format!("latency {:.1} ms, {:.1} audio-s/s, peak {} GiB\n\n", b.latency_ms, b.audio_s_per_s, gib(b.peak_bytes)));
    }
    s.push_str("## 2. Precision at batch 1\n\n| precision | speed-up vs fp32 | memory saved (MiB) | SNR vs fp32 (dB) | LSD (dB) |\n|---|---|---|---|---|\n");
    for q in &r.precision_at_batch_1 {
        s.push_str(&format!(
            "| {} | {:.2}× | {:.0} | {} | {:.3} |\n",
            q.precision,
            q.speedup_vs_fp32,
            q.memory_saved_bytes as f64 / 1048576.0,
            if q.snr_db.is_infinite() { "∞".to_string() } else { format!("{:.1}", q.snr_db) },
            q.lsd_db
        ));
    }
    s.push_str("\n## 3. Batch sweep\n\n| precision | batch | latency (ms) | audio-s/s | peak (GiB) | note |\n|---|---|---|---|---|---|\n");
    for p in &r.sweep {
        s.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {} | {} |\n",
            p.precision,
            p.batch,
            p.latency_ms,
            p.audio_s_per_s,
            gib(p.peak_bytes),
            if p.oom { "OOM" } else if p.over_ceiling { "over ceiling" } else { "" }
        ));
    }
    s.push_str("\n## 4. Sweet spot (knee: last batch size with ≥ 5 % gain, under the ceiling)\n\n| precision | batch | audio-s/s | peak (GiB) |\n|---|---|---|---|\n");
    for k in &r.knees {
        s.push_str(&format!("| {} | {} | {:.1} | {} |\n", k.precision, k.batch, k.audio_s_per_s, gib(k.peak_bytes)));
    }
    if let Some(k) = &r.recommended {
        s.push_str(&format!("\n**Recommended: {} at batch {} — {:.1} audio-seconds per second.**\n", k.precision, k.batch, k.audio_s_per_s));
    }
    if let Some(k) = &r.soak {
        s.push_str(&format!(
            "\n## 5. Soak ({} batch {}, {:.0} s, {} batches)\n\nmean {:.1} audio-s/s, window CV {:.2} %, allocated {} → {} GiB, temperature max {}, power mean {}, energy {}\n\nwindows: {}\n",
            k.precision,
            k.batch,
            k.seconds,
            k.batches,
            k.mean_audio_s_per_s,
            k.cv * 100.0,
            gib(k.allocated_first_bytes),
            gib(k.allocated_last_bytes),
            k.temp_max_c.map(|t| format!("{t:.0} °C")).unwrap_or_else(|| "-".into()),
            k.power_mean_w.map(|p| format!("{p:.0} W")).unwrap_or_else(|| "-".into()),
            k.energy_j.map(|e| format!("{:.1} kJ", e / 1000.0)).unwrap_or_else(|| "-".into()),
            k.window_audio_s_per_s.iter().map(|w| format!("{w:.1}")).collect::<Vec<_>>().join(", ")
        ));
    }
    s.push_str("\n## 6. Cost at the sweet spot\n\n| price of | $/GPU-hour | $ per audio hour |\n|---|---|---|\n");
    for c in &r.cost_table {
        s.push_str(&format!("| {} | {:.2} | {:.5} |\n", c.gpu, c.hourly_usd, c.usd_per_audio_hour));
    }
    if !r.config_snippet.is_empty() {
        s.push_str(&format!("\nRecommended configuration:\n\n```toml\n{}```\n", r.config_snippet));
    }
    if !r.notes.is_empty() {
        s.push_str("\nNotes:\n");
        for n in &r.notes {
            s.push_str(&format!("- {n}\n"));
        }
    }
    s
}

/// Writes report.md, sweetspot.json, throughput.svg and memory.svg into `dir`.
pub fn write(r: &SweetSpotReport, dir: &std::path::Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    use crate::plot::{svg, Panel, Series};
    let mut precisions: Vec<String> = r.sweep.iter().map(|p| p.precision.clone()).collect();
    precisions.dedup();
    let series = |f: &dyn Fn(&Point) -> Option<f64>| -> Vec<Series> {
        precisions
            .iter()
            .map(|prec| Series {
                name: prec.clone(),
                points: r.sweep.iter().filter(|p| &p.precision == prec && !p.oom).filter_map(|p| f(p).map(|v| (p.batch as f64, v))).collect(),
                horizontal: false,
            })
            .collect()
    };
    let tput = svg(&[Panel { title: format!("Throughput, {}", r.model), y_label: "audio-seconds per second".into(), series: series(&|p| Some(p.audio_s_per_s)) }], "batch size");
    let mem = svg(
        &[Panel {
            title: format!("Peak memory, {}", r.model),
            y_label: "GiB".into(),
            series: series(&|p| p.peak_bytes.map(|b| b as f64 / (1u64 << 30) as f64)),
        }],
        "batch size",
    );
    let paths = vec![dir.join("report.md"), dir.join("sweetspot.json"), dir.join("throughput.svg"), dir.join("memory.svg")];
    std::fs::write(&paths[0], markdown(r))?;
    std::fs::write(&paths[1], serde_json::to_vec_pretty(r).map_err(std::io::Error::other)?)?;
    std::fs::write(&paths[2], tput)?;
    std::fs::write(&paths[3], mem)?;
    Ok(paths)
}

