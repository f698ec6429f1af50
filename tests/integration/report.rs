//! Cost arithmetic and report queries against Postgres with known rows.

use crate::common;

use chrono::{TimeZone, Utc};
use common::TestEnv;
use voxbatch::report::{report, Dimension};

async fn exec(env: &TestEnv, sql: &str) {
    sqlx::raw_sql(sql).execute(env.db.pool()).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Two workers (an H200 at $4/h, a CPU at $0.10/h), three batches, five jobs in two campaigns.
async fn seed(env: &TestEnv) {
    exec(env, "
        INSERT INTO workers (worker_id, host, device, gpu_name, hourly_usd, busy_ms, alive_ms, started_at, last_heartbeat)
        VALUES ('g', 'h', 'cuda:0', 'NVIDIA H200', 4.0, 1800000, 3600000, '2026-12-01 00:00Z', '2026-12-01 01:00Z'),
               ('c', 'h', 'cpu', NULL, 0.1, 3600000, 3600000, '2026-12-02 00:00Z', '2026-12-02 01:00Z');
        INSERT INTO batches (batch_id, worker_id, model, device, precision, batch_size, tokens, padded_tokens, flush_reason,
            queue_ms, infer_ms, encode_ms, upload_ms, db_ms, audio_seconds, started_at, finished_at,
            gpu_name, gpu_util_mean, gpu_energy_j, hourly_usd, cost_usd)
        VALUES
          ('00000000-0000-0000-0000-0000000000b1', 'g', 'm-large', 'cuda:0', 'bf16', 2, 100, 120, 'full',
           0, 900000, 0, 0, 0, 3600, '2026-12-01 00:10Z', '2026-12-01 00:25Z', 'NVIDIA H200', 80, 360000, 4.0, 1.0),
          ('00000000-0000-0000-0000-0000000000b2', 'g', 'm-large', 'cuda:0', 'fp32', 1, 50, 50, 'deadline',
           0, 900000, 0, 0, 0, 1800, '2026-12-01 00:30Z', '2026-12-01 00:45Z', 'NVIDIA H200', 40, 180000, 4.0, 1.0),
          ('00000000-0000-0000-0000-0000000000b3', 'c', 'm-tiny', 'cpu', 'fp32', 2, 10, 20, 'drain',
           0, 3600000, 0, 0, 0, 7200, '2026-12-02 00:00Z', '2026-12-02 01:00Z', NULL, NULL, NULL, 0.1, 0.1);
        INSERT INTO jobs (job_id, campaign, voice, text, status, chars, audio_seconds, batch_id, finished_at) VALUES
          ('00000000-0000-0000-0000-000000000001', 'book', 'default', 'a', 'done', 1000, 2700, '00000000-0000-0000-0000-0000000000b1', '2026-12-01 00:25Z'),
          ('00000000-0000-0000-0000-000000000002', 'ads',  'default', 'b', 'done', 500,  900,  '00000000-0000-0000-0000-0000000000b1', '2026-12-01 00:25Z'),
          ('00000000-0000-0000-0000-000000000003', 'book', 'default', 'c', 'done', 500,  1800, '00000000-0000-0000-0000-0000000000b2', '2026-12-01 00:45Z'),
          ('00000000-0000-0000-0000-000000000004', 'ads',  'default', 'd', 'done', 3000, 3600, '00000000-0000-0000-0000-0000000000b3', '2026-12-02 01:00Z'),
          ('00000000-0000-0000-0000-000000000005', 'ads',  'default', 'e', 'done', 1000, 3600, '00000000-0000-0000-0000-0000000000b3', '2026-12-02 01:00Z'),
          ('00000000-0000-0000-0000-000000000006', 'ads',  'default', 'f', 'failed', 10, NULL, NULL, NULL);
    ").await;
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9 * b.abs().max(1.0)
}

#[tokio::test]
async fn cost_and_throughput_are_attributed_by_audio_share_and_grouped() {
    let env = TestEnv::new("report").await;
    seed(&env).await;

    let r = report(&env.db, Dimension::Campaign, None, None).await.unwrap();
    let ads = r.rows.iter().find(|x| x.key == "ads").unwrap();
    let book = r.rows.iter().find(|x| x.key == "book").unwrap();
    // b1 ($1, 0.25 GPU-h, 3600 audio-s) splits 3:1 between book and ads.
    assert_eq!((book.jobs, book.chars), (2, 1500));
    assert!(close(book.cost_usd.unwrap(), 0.75 + 1.0));
    assert!(close(book.audio_hours, 1.25));
    assert!(close(book.gpu_hours, 0.1875 + 0.25));
    assert!(close(book.usd_per_audio_hour.unwrap(), 1.75 / 1.25));
    assert!(close(book.usd_per_million_chars.unwrap(), 1.75 / 0.0015));
    assert!(close(book.real_time_factor.unwrap(), 0.4375 / 1.25));
    // Energy: 3/4 of 360 kJ + 180 kJ = 450 kJ = 0.125 kWh; utilisation weighted by GPU time.
    assert!(close(book.energy_kwh.unwrap(), 0.125));
    assert!(close(book.gpu_util_mean.unwrap(), (80.0 * 0.1875 + 40.0 * 0.25) / 0.4375));
    assert!(close(ads.cost_usd.unwrap(), 0.25 + 0.1));
    assert_eq!(ads.jobs, 3, "failed jobs are not in the cost report");
    let total = r.total.as_ref().unwrap();
    assert!(close(total.cost_usd.unwrap(), 2.1));
    assert_eq!(total.jobs, 5);

    // Idle time: the GPU worker was busy half its hour ($2 of $4 idle), the CPU worker all of it.
    assert_eq!(r.workers.workers, 2);
    assert!(close(r.workers.idle_hours, 0.5));
    assert!(close(r.workers.idle_cost_usd, 2.0));
    assert!(close(r.workers.utilisation.unwrap(), 1.5 / 2.0));

    let by_precision = report(&env.db, Dimension::Precision, None, None).await.unwrap();
    let keys: Vec<&str> = by_precision.rows.iter().map(|x| x.key.as_str()).collect();
    assert_eq!(keys, ["bf16", "fp32"]);
    let by_gpu = report(&env.db, Dimension::Gpu, None, None).await.unwrap();
    let keys: Vec<&str> = by_gpu.rows.iter().map(|x| x.key.as_str()).collect();
    assert_eq!(keys, ["NVIDIA H200", "cpu"]);
    let by_size = report(&env.db, Dimension::BatchSize, None, None).await.unwrap();
    assert_eq!(by_size.rows.iter().find(|x| x.key == "2").unwrap().jobs, 4);
    let by_model = report(&env.db, Dimension::Model, None, None).await.unwrap();
    assert_eq!(by_model.rows.len(), 2);
    let by_day = report(&env.db, Dimension::Day, None, None).await.unwrap();
    assert_eq!(by_day.rows.len(), 2);

    // --since and --campaign filter.
    let since = Utc.with_ymd_and_hms(2026, 12, 2, 0, 0, 0).unwrap();
    let r = report(&env.db, Dimension::Campaign, Some(since), Some("ads")).await.unwrap();
    assert_eq!(r.rows.len(), 1);
    assert_eq!(r.rows[0].jobs, 2);
    assert!(close(r.rows[0].cost_usd.unwrap(), 0.1));
    assert_eq!(r.workers.workers, 1, "only the worker alive since then");

    // The views analysts use in psql agree.
    let v: f64 = sqlx::query_scalar("SELECT cost_usd FROM cost_by_campaign WHERE key = 'book'").fetch_one(env.db.pool()).await.unwrap();
    assert!(close(v, 1.75));
    env.cleanup().await;
}

#[tokio::test]
async fn hours_and_throughput_are_named_after_the_devices_that_ran_the_batches() {
    let env = TestEnv::new("report_devices").await;
    seed(&env).await;
    use voxbatch::report::{render, Devices, Format};
    // Campaign ads since 2026-12-02: only the CPU worker's batch.
    let since = Utc.with_ymd_and_hms(2026, 12, 2, 0, 0, 0).unwrap();
    let cpu = report(&env.db, Dimension::Campaign, Some(since), Some("ads")).await.unwrap();
    assert_eq!(cpu.devices, Devices::Cpu);
    for format in [Format::Table, Format::Csv] {
        let out = render(&cpu, format).unwrap();
        assert!(out.contains("cpu_hours") && out.contains("audio_s_per_cpu_s") && !out.contains("gpu_hours"), "{out}");
    }
    let book = report(&env.db, Dimension::Campaign, None, Some("book")).await.unwrap();
    assert_eq!(book.devices, Devices::Gpu);
    assert!(render(&book, Format::Table).unwrap().contains("gpu_hours"));
    let all = report(&env.db, Dimension::Campaign, None, None).await.unwrap();
    assert_eq!(all.devices, Devices::Mixed);
    let table = render(&all, Format::Table).unwrap();
    assert!(table.contains("device_hours") && table.contains("audio_s_per_device_s"), "{table}");
    // Headers whole, one line per row: the header, book, ads, TOTAL.
    let header = table.lines().nth(1).unwrap();
    assert!(header.contains("usd_per_million_chars") && header.contains("energy_kwh"), "{table}");
    let json: serde_json::Value = serde_json::from_str(&render(&all, Format::Json).unwrap()).unwrap();
    assert_eq!(json["devices"], "mixed");
    env.cleanup().await;
}
