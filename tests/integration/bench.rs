//! The benchmarks run end to end on CPU with the tiny model (short settings). They assert on
//! structure and invariants, never on speed.

use crate::common;

use std::time::Duration;

use voxbatch::bench::sweetspot::{run, write, SweetSpotOptions};
use voxbatch::model::{Device, Precision};

#[tokio::test]
async fn the_sweet_spot_bench_runs_every_step_and_writes_its_report() {
    let cfg = voxbatch::config::Config::defaults().unwrap();
    let opts = SweetSpotOptions {
        model_dir: common::model_dir(),
        device: Device::Cpu,
        precisions: vec![Precision::Fp32, Precision::Bf16, Precision::Tf32],
        utterance_seconds: 0.5,
        max_batch: 4,
        vram_fraction: 0.8,
        soak: Duration::from_millis(500),
        repeats: 1,
        knee_gain: 0.05,
        min_snr_db: 20.0,
        prices: cfg.cost.prices.clone(),
        cpu_threads: 1,
    };
    let report = run(&opts, |_| {}).await.unwrap();
    let baseline = report.baseline.as_ref().expect("baseline at batch 1, fp32");
    assert_eq!((baseline.precision.as_str(), baseline.batch), ("fp32", 1));
    let fp32 = report.precision_at_batch_1.iter().find(|q| q.precision == "fp32").unwrap();
    assert!(fp32.snr_db.is_infinite(), "fp32 against itself");
    let bf16 = report.precision_at_batch_1.iter().find(|q| q.precision == "bf16").unwrap();
    assert!(bf16.snr_db.is_finite() && bf16.snr_db > 0.0, "bf16 differs measurably: {}", bf16.snr_db);
    assert!(report.notes.iter().any(|n| n.starts_with("tf32")), "tf32 is reported as not run on CPU");
    for b in [1, 2, 4] {
        assert!(report.sweep.iter().any(|p| p.precision == "fp32" && p.batch == b), "fp32 batch {b} swept");
    }
    let rec = report.recommended.as_ref().expect("a recommendation");
    assert!(report.knees.iter().any(|k| k.precision == rec.precision && k.batch == rec.batch));
    let soak = report.soak.as_ref().expect("soaked");
    assert!(soak.batches > 0 && soak.mean_audio_s_per_s > 0.0);
    assert!(!report.cost_table.is_empty() && report.cost_table[0].usd_per_audio_hour > 0.0);
    assert!(report.config_snippet.contains(&format!("max_batch = {}", rec.batch)));

    let dir = tempfile::tempdir().unwrap();
    let paths = write(&report, dir.path()).unwrap();
    let md = std::fs::read_to_string(&paths[0]).unwrap();
    for section in ["## 1. Baseline", "## 2. Precision", "## 3. Batch sweep", "## 4. Sweet spot", "## 5. Soak", "## 6. Cost"] {
        assert!(md.contains(section), "{section} missing");
    }
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&paths[1]).unwrap()).unwrap();
    assert_eq!(json["model"], "reference-tiny");
    assert!(std::fs::read_to_string(&paths[2]).unwrap().contains("<polyline"));
}

#[tokio::test]
async fn the_policy_bench_compares_the_policy_with_fixed_sizes_without_losing_jobs() {
    let model = voxbatch::model::ModelHandle::load(&common::model_dir(), Device::Cpu, Precision::Fp32, voxbatch::model::LoadOptions { cpu_threads: 1, ..Default::default() }).await.unwrap();
    let m = voxbatch::batch::memory::MemoryModel { m0: 1e8, a: 4.0 * 512.0 * 240.0, b: 0.0 };
    let admission = voxbatch::batch::memory::MemoryBudget::new(m, 6, 2e9, 1 << 20, Default::default());
    // Six jobs (every configuration synthesizes all of them, seven times over): the comparison
    // and the no-loss accounting. Seed 2's are 13 to 308 characters (631 in all; seed 3's were
    // 3,601 with two of 1,272 and 1,934, and the test took 35-38 s on two cores, half of it the
    // kernel's page faults).
    let opts = voxbatch::bench::policy::PolicyBenchOptions {
        jobs: 6,
        seed: 2,
        max_batch: 4,
        gpu_name: "cpu".into(),
        profile_source: "test".into(),
        max_length_ratio: 1.5,
        policy_only: false,
    };
    let report = voxbatch::bench::policy::run(&model, admission, &opts, |_| {}).await;
    let configs: Vec<&str> = report.runs.iter().map(|r| r.config.as_str()).collect();
    assert_eq!(configs, ["fixed-1", "sorted-1", "fixed-2", "sorted-2", "fixed-4", "sorted-4", "policy"]);
    assert!(report.runs.iter().all(|r| r.jobs == 6 && r.failed_jobs == 0), "every configuration did every job");
    let policy = report.runs.last().unwrap();
    assert!(policy.worst_prediction_error.is_some());
    assert!(report.policy_vs_best_fixed.is_some());
    let dir = tempfile::tempdir().unwrap();
    let paths = voxbatch::bench::policy::write(&report, dir.path()).unwrap();
    assert_eq!(paths.len(), 3);
}

#[test]
fn the_token2wav_bench_sweeps_batches_times_stages_and_measures_quality() {
    use voxbatch::bench::token2wav::{run, table, write, Token2WavBenchOptions};
    let opts = Token2WavBenchOptions {
        model_dir: common::repo_path("models/cosyvoice2-tiny"),
        device: Device::Cpu,
        precisions: vec![Precision::Bf16],
        vocoders: vec![Precision::Tf32, Precision::Bf16],
        batches: vec![1, 2],
        utterance_seconds: 0.4,
        repeats: 1,
        cudnn_benchmark: false,
        cudnn_attention: false,
        profile: true,
        // Asked for, but a CPU never captures one: the report says so.
        flow_graphs: voxbatch::model::cosyvoice2::flow_graphs::FlowGraphSettings { graphs: 4, max_frames: 32_768 },
        seed: 7,
    };
    let report = run(&opts, |_| {}).unwrap();
    assert_eq!(report.tokens_per_utterance, 10);
    let graphs = report.flow_graph_stats.expect("graphs were asked for");
    assert_eq!((graphs.captured, graphs.replays), (0, 0), "no CUDA graph on a CPU");
    assert_eq!(report.points.len(), 4, "bf16 flow with each vocoder at batch 1 and 2 (true fp32 only as the quality reference)");
    for p in &report.points {
        assert!(p.error.is_none(), "{:?}", p.error);
        assert!(p.audio_seconds_per_second > 0.0);
        let parts = p.encoder_seconds + p.flow_seconds + p.vocoder_seconds;
        assert!(parts > 0.0 && parts <= p.seconds * 1.01, "stage times add up to at most the batch's: {parts} vs {}", p.seconds);
    }
    let q = |vocoder: &str| report.quality.iter().find(|q| q.precision == "bf16" && q.vocoder == vocoder).expect("each setting against true fp32");
    assert!(q("bf16").snr_db_mean.is_finite() && q("bf16").lsd_db_mean > 0.0, "bf16 differs measurably from fp32");
    // On a CPU the tf32 vocoder is fp32: the bf16 vocoder loses more.
    assert!(q("tf32").snr_db_mean > q("bf16").snr_db_mean, "{:?}", report.quality);
    let dir = tempfile::tempdir().unwrap();
    let paths = write(&report, dir.path()).unwrap();
    assert!(paths.iter().all(|p| p.is_file()));
    assert!(table(&report).contains("| bf16 | tf32 | 2 |") && table(&report).contains("| bf16 | bf16 | 2 |"), "{}", table(&report));
    // `profile`: the first setting's largest batch once under the profiler, by category and by event
    // (operators on a CPU: the estimator's linear layers are matmuls).
    let profile = report.profile.as_ref().expect("a profile");
    assert!(profile.error.is_none(), "{:?}", profile.error);
    assert_eq!((profile.precision.as_str(), profile.vocoder.as_str(), profile.batch), ("bf16", "tf32", 2));
    assert!(profile.by_category.iter().any(|(c, s)| c == "matmul" && *s > 0.0), "{:?}", profile.by_category);
    assert!(!profile.top.is_empty() && table(&report).contains("Where one run's time went"));
}

#[test]
fn the_token2wav_bench_runs_a_cosyvoice3_model_its_vocoder_at_the_flows_precision() {
    use voxbatch::bench::token2wav::{run, table, Token2WavBenchOptions};
    let opts = Token2WavBenchOptions {
        model_dir: common::repo_path("models/cosyvoice3-tiny"),
        device: Device::Cpu,
        precisions: vec![Precision::Fp32, Precision::Bf16],
        vocoders: Vec::new(),
        batches: vec![1, 2],
        utterance_seconds: 0.4,
        repeats: 1,
        cudnn_benchmark: false,
        cudnn_attention: false,
        profile: false,
        flow_graphs: Default::default(),
        seed: 7,
    };
    let report = run(&opts, |_| {}).unwrap();
    assert_eq!(report.model, "cosyvoice3-tiny");
    // CosyVoice3's vocoder runs inside the flow's autocast upstream: bf16 flow, bf16 vocoder.
    let settings: Vec<(&str, &str, usize)> = report.points.iter().map(|p| (p.precision.as_str(), p.vocoder.as_str(), p.batch)).collect();
    assert_eq!(settings, [("fp32", "fp32", 1), ("fp32", "fp32", 2), ("bf16", "bf16", 1), ("bf16", "bf16", 2)]);
    for p in &report.points {
        assert!(p.error.is_none() && p.audio_seconds_per_second > 0.0, "{p:?}");
        assert!(p.encoder_seconds > 0.0 && p.flow_seconds > 0.0 && p.vocoder_seconds > 0.0, "every stage timed: {p:?}");
    }
    // Quality against true fp32: bf16 measurably different, fp32's own setting not listed.
    assert_eq!(report.quality.len(), 1);
    assert!(report.quality[0].snr_db_mean.is_finite(), "bf16 differs from fp32: {:?}", report.quality[0]);
    assert!(table(&report).contains("| bf16 | bf16 | 2 |"));
}

#[test]
fn the_llm_bench_profiles_each_slot_counts_step_alone_when_asked() {
    use voxbatch::bench::llm::{run, table, LlmBenchOptions, PROFILE_STEPS};
    let opts = LlmBenchOptions {
        model_dir: common::repo_path("models/cosyvoice2-tiny"),
        device: Device::Cpu,
        slots: vec![2],
        requests_per_slot: 1,
        min_requests: 2,
        graphs: false,
        profile: true,
        seed: 11,
        reference: None,
    };
    let report = run(&opts, |_| {}).unwrap();
    let p = &report.points[0];
    assert!(p.error.is_none(), "{:?}", p.error);
    assert!(p.tokens > 0 && p.step_ms.is_some());
    // Operators on a CPU: the decoder's projections are matmuls, every step launches the same.
    let sp = p.step_profile.as_ref().expect("a step profile was asked for");
    assert!(sp.error.is_none(), "{:?}", sp.error);
    assert_eq!(sp.steps, PROFILE_STEPS);
    assert!(sp.events_per_step >= 10.0 && sp.event_ms_per_step > 0.0, "{sp:?}");
    assert!(sp.by_category.iter().any(|(c, s)| c == "matmul" && *s > 0.0), "{:?}", sp.by_category);
    assert!(table(&report).contains("One step of 2 slots under the profiler"), "{}", table(&report));
}
