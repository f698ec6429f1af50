//! The text frontend against CosyVoice's reference (issue 14):
//! - token ids: the converted `tokenizer.json` (a stand-in Qwen2 tokenizer, `tools/make_llm_fixtures.py`)
//!   gives the reference `QwenTokenizer`'s ids over the multilingual table `tests/data/tokenizer_cases.txt`;
//! - normalisation: `tests/data/normalize_cases.tsv` — input, the reference's output
//!   (`tools/normalize_reference.py`), ours, and why where they differ. Ours must stay what the
//!   table says; every difference from the reference must say why.
//! - segments and the dry run's contract (`Frontend::prepare`), and how the dry run and `enqueue`
//!   read a line with nothing to say (issue 39: a line of U+3000 is reported in its place, never a
//!   reason to refuse the whole input).
//!
//! `VOXBATCH_TEST_WRITE_TABLE=1` rewrites the table's "ours" column from this build (then review the diff).

use std::path::PathBuf;

use crate::common::TestEnv;
use voxbatch::frontend::normalize::Normalizer;
use voxbatch::frontend::segment::{Lang, SegmentLimits};
use voxbatch::frontend::tokenizer::TextTokenizer;
use voxbatch::frontend::{Frontend, FrontendError};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn model() -> PathBuf {
    let dir = root().join("models/cosyvoice2-tiny");
    assert!(dir.join("tokenizer.json").is_file(), "{} has no tokenizer.json: run scripts/bootstrap.sh", dir.display());
    dir
}

#[test]
fn the_tokenizer_gives_the_reference_ids_over_the_multilingual_table() {
    let tok = TextTokenizer::load(&model().join("tokenizer.json")).unwrap();
    let fx: serde_json::Value = serde_json::from_slice(&std::fs::read(root().join("models/cosyvoice2-llm-parity/tokenizer_parity.json")).unwrap()).unwrap();
    let cases = fx["cases"].as_array().unwrap();
    assert!(cases.len() >= 25, "the table has {} cases", cases.len());
    assert_eq!(tok.vocab_size() as u64, fx["vocab_size"].as_u64().unwrap(), "base vocabulary plus CosyVoice2's special tokens");
    let mut specials = 0;
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<i64> = case["ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
        assert_eq!(tok.encode(text).unwrap(), want, "{text:?}");
        specials += usize::from(text.contains("[breath]"));
    }
    assert!(specials > 0, "the table exercises CosyVoice2's special tokens");
}

struct Row {
    input: String,
    reference: String,
    ours: String,
    why: String,
}

fn table_path() -> PathBuf {
    root().join("tests/data/normalize_cases.tsv")
}

fn table() -> Vec<Row> {
    std::fs::read_to_string(table_path())
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert!(f.len() == 4, "4 tab-separated columns: {l}");
            Row { input: f[0].into(), reference: f[1].into(), ours: f[2].into(), why: f[3].into() }
        })
        .collect()
}

#[test]
fn normalisation_matches_the_reference_table_and_every_difference_says_why() {
    let n = Normalizer::new(&model().join("fsts")).unwrap();
    let rows = table();
    assert!(rows.len() >= 100, "{} cases", rows.len());
    if std::env::var("VOXBATCH_TEST_WRITE_TABLE").is_ok() {
        let mut out = String::from("# input\treference (tools/normalize_reference.py)\tours\twhy they differ\n");
        for r in &rows {
            let ours = n.normalize(&r.input).unwrap().0;
            out += &format!("{}\t{}\t{ours}\t{}\n", r.input, r.reference, if ours == r.reference { "" } else { r.why.as_str() });
        }
        std::fs::write(table_path(), out).unwrap();
    }
    let mut differ = 0;
    for r in &rows {
        let (ours, lang) = n.normalize(&r.input).unwrap();
        assert_eq!(ours, r.ours, "{}", r.input);
        assert_eq!(lang == Lang::Zh, voxbatch::frontend::normalize::contains_chinese(&r.input));
        if ours != r.reference {
            differ += 1;
            assert!(!r.why.trim().is_empty(), "{}: ours differs from the reference without a reason", r.input);
        }
    }
    assert!(differ > 0 && differ < rows.len() / 2, "{differ} of {} differ", rows.len());
}

#[test]
fn grammar_copies_normalise_in_parallel_as_one_grammar_does() {
    // Four threads over the table at once, on a normaliser with a copy per thread: every copy is
    // configured as the one-copy normaliser (language, erhua, full-width), whichever serves a case.
    let n = Normalizer::with_copies(&model().join("fsts"), 4).unwrap();
    let rows = table();
    std::thread::scope(|scope| {
        for t in 0..4 {
            let (n, rows) = (&n, &rows);
            scope.spawn(move || {
                for r in rows.iter().skip(t).step_by(2) {
                    assert_eq!(n.normalize(&r.input).unwrap().0, r.ours, "{}", r.input);
                }
            });
        }
    });
}

#[test]
fn prepare_all_gives_each_text_what_prepare_gives_it_in_order() {
    let limits = SegmentLimits { max: 80, min: 60, merge: 20, hard_max: 80 };
    let f = Frontend::load_for_threads(&model(), limits, 3).unwrap();
    let rows = table();
    let mut texts: Vec<&str> = rows.iter().map(|r| r.input.as_str()).collect();
    texts.push("……"); // nothing to say: its error in its place
    let all = f.prepare_all(&texts, 3);
    assert_eq!(all.len(), texts.len());
    for (text, got) in texts.iter().zip(&all) {
        match (f.prepare(text), got) {
            (Ok(one), Ok(par)) => {
                assert_eq!((&one.normalized, one.segments.len()), (&par.normalized, par.segments.len()), "{text}");
                assert!(one.segments.iter().zip(&par.segments).all(|(a, b)| a.tokens == b.tokens), "{text}");
            }
            (Err(one), Err(par)) => assert_eq!(one.to_string(), par.to_string(), "{text}"),
            (one, par) => panic!("{text}: one at a time {:?}, in parallel {:?}", one.is_ok(), par.is_ok()),
        }
    }
    assert!(all.last().is_some_and(|r| r.is_err()));
}

#[test]
fn prepare_segments_long_text_within_the_cap_and_refuses_text_with_nothing_to_say() {
    let limits = SegmentLimits { max: 80, min: 60, merge: 20, hard_max: 80 };
    let f = Frontend::load(&model(), limits).unwrap();
    let chapter = "第一章。".to_string() + &"今天天气很好，我们一起去公园散步，看到了很多美丽的花。".repeat(30);
    let p = f.prepare(&chapter).unwrap();
    assert_eq!(p.lang, Lang::Zh);
    assert!(p.segments.len() > 5, "{} segments", p.segments.len());
    assert!(p.segments.iter().all(|s| s.tokens.len() <= 80 && !s.tokens.is_empty()));
    assert_eq!(p.segments.iter().map(|s| s.text.as_str()).collect::<String>(), p.normalized, "nothing lost, in order");
    let en = f.prepare("It costs $1,299.50. Call me at 10:30 am!").unwrap();
    assert_eq!(en.lang, Lang::En);
    assert!(en.normalized.contains("one thousand two hundred and ninety nine dollars"), "{}", en.normalized);
    for nothing in ["", "   ", "。。。！！", "……——"] {
        let e = f.prepare(nothing).unwrap_err();
        assert!(matches!(e, FrontendError::Empty) && e.is_input(), "{nothing:?}: {e}");
    }
}

#[test]
fn the_text_dry_run_prints_segments_estimates_and_refusals_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jobs.jsonl");
    std::fs::write(
        &file,
        "{\"text\":\"价格是¥1,299.00，欢迎购买。\",\"campaign\":\"shop\"}\n{\"text\":\"It costs $0.99.\"}\n{\"text\":\"。。。\"}\n{\"text\":\"It costs $0.99.\",\"speed\":2}\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_voxbatch"))
        .args(["text", file.to_str().unwrap(), "--model", model().to_str().unwrap(), "--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let jobs = r["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 4);
    assert_eq!(jobs[0]["campaign"], "shop");
    assert_eq!(jobs[0]["normalized"], "价格是一千二百九十九元，欢迎购买。");
    assert!(jobs[0]["segments"][0]["tokens"].as_u64().unwrap() > 0);
    assert_eq!(jobs[1]["normalized"], "It costs ninety nine cents.");
    assert!(jobs[2]["error"].as_str().unwrap().contains("nothing to say"));
    let t = &r["totals"];
    assert_eq!((t["jobs"].as_u64(), t["refused"].as_u64()), (Some(4), Some(1)));
    // 17 non-blank characters of normalised Chinese at 4 a second, 23 of English at 14, and those
    // 23 again at speed 2: half the audio for the same work (the cost is the work's).
    assert!((jobs[3]["audio_seconds"].as_f64().unwrap() - 23.0 / 28.0).abs() < 1e-9);
    assert_eq!((jobs[3]["speed"].as_f64(), jobs[1].get("speed")), (Some(2.0), None));
    let audio = t["audio_seconds"].as_f64().unwrap();
    assert!((audio - (17.0 / 4.0 + 23.0 / 14.0 + 23.0 / 28.0)).abs() < 1e-9, "{audio}");
    let cost = (17.0 / 4.0 + 2.0 * 23.0 / 14.0) / 290.0 * 4.0 / 3600.0;
    assert!((t["cost_usd"].as_f64().unwrap() - cost).abs() < 1e-12);
}

/// Digit words of `text` (English "oh"/"zero"…"nine", Chinese 零/幺/一…九), in order.
fn digit_words(text: &str) -> Vec<u32> {
    const EN: [&str; 10] = ["oh", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"];
    const ZH: [char; 10] = ['零', '幺', '二', '三', '四', '五', '六', '七', '八', '九'];
    let en = text.split(|c: char| !c.is_alphabetic()).filter_map(|w| EN.iter().position(|d| *d == w).map(|d| d as u32));
    let zh = text.chars().filter_map(|c| ZH.iter().position(|d| *d == c).map(|d| d as u32));
    en.chain(zh).collect()
}

#[test]
fn a_number_of_nineteen_thousand_digits_is_read_digit_by_digit_in_segments_within_the_cap_never_as_zero() {
    // Issue 39 item 11: "Order 18446744073709551616 shipped." read "Order zero shipped.", and a
    // 19,000-digit job ended done with a second of audio. Every digit is read, in order, in both
    // languages, and nothing of it is lost between the segments.
    let limits = SegmentLimits { max: 80, min: 60, merge: 20, hard_max: 80 };
    let f = Frontend::load(&model(), limits).unwrap();
    let digits: String = (0..19_000u32).map(|i| char::from_digit((i * 7 + 3) % 10, 10).unwrap()).collect();
    let want: Vec<u32> = digits.chars().map(|c| c.to_digit(10).unwrap()).collect();
    for (text, lang) in [(format!("Order {digits} shipped."), Lang::En), (format!("订单{digits}已发货。"), Lang::Zh)] {
        let p = f.prepare(&text).unwrap();
        assert_eq!(p.lang, lang);
        assert_eq!(digit_words(&p.normalized), want, "{lang:?}: every digit read, in order");
        let segments: String = p.segments.iter().map(|s| s.text.as_str()).collect::<Vec<_>>().join(" ");
        assert_eq!(digit_words(&segments), want, "{lang:?}: nothing lost between segments");
        assert!(p.segments.len() > 100 && p.segments.iter().all(|s| !s.tokens.is_empty() && s.tokens.len() <= 80), "{lang:?}");
    }
    let n = Normalizer::new(&model().join("fsts")).unwrap();
    let (order, _) = n.normalize("Order 18446744073709551616 shipped.").unwrap();
    assert!(!order.contains("zero") && order.starts_with("Order one eight four four"), "{order}");
}

fn dry_run_of_stdin(input: &str, format: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_voxbatch"))
        .args(["text", "-", "--model", model().to_str().unwrap(), "--format", format])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn a_whitespace_only_line_is_reported_in_its_place_and_the_dry_run_of_stdin_goes_on() {
    // Issue 39 item 5: one line of U+3000 aborted the whole dry run with enqueue's wording
    // ("nothing was enqueued") and the path of a temporary copy of standard input.
    let input = "Hello there.\n\u{3000}\n。。。\n你好。\n";
    let out = dry_run_of_stdin(input, "json");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let jobs = r["jobs"].as_array().unwrap();
    assert_eq!(jobs.iter().map(|j| j["line"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2, 3, 4], "every line in its place");
    assert!(jobs[1]["job_id"].is_null(), "a whitespace-only line is not a job");
    let why = jobs[1]["error"].as_str().unwrap();
    assert!(why.contains("only whitespace") && why.contains("U+3000") && why.contains("enqueue` leaves it out"), "{why}");
    assert!(jobs[2]["error"].as_str().unwrap().contains("nothing to say"), "a punctuation-only job is refused as before");
    assert!(jobs[0]["error"].is_null() && jobs[3]["error"].is_null());
    let t = &r["totals"];
    assert_eq!((t["jobs"].as_u64(), t["refused"].as_u64(), t["left_out"].as_u64()), (Some(3), Some(1), Some(1)));

    // Read as a stream, the ids are those `enqueue` derives from a file of the same bytes.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("same.txt");
    std::fs::write(&file, input).unwrap();
    let from_file = voxbatch::enqueue::read_jobs(&file, &Default::default(), &Default::default()).unwrap();
    let ids: Vec<&str> = jobs.iter().filter_map(|j| j["job_id"].as_str()).collect();
    assert_eq!(ids, from_file.iter().map(|j| j.job_id.to_string()).collect::<Vec<_>>().iter().map(String::as_str).collect::<Vec<_>>());

    let table = dry_run_of_stdin(input, "table");
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success() && text.contains("line 2\n  left out: the line is only whitespace (U+3000)"), "{text}");
    assert!(text.contains("3 jobs (1 refused), 1 line(s) left out"), "{text}");

    // Invalid lines still stop it, in its own words: no temporary file, nothing "enqueued".
    let bad = dry_run_of_stdin("{\"text\":\"ok\"}\n{\"text\":42}\n", "json");
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("standard input: 1 invalid line(s)") && err.contains("line 2"), "{err}");
    assert!(!err.contains("nothing was enqueued") && !err.contains("voxbatch-text-"), "{err}");
}

#[tokio::test]
async fn enqueue_leaves_out_a_whitespace_only_line_says_which_and_publishes_the_rest() {
    // Issue 39 item 5, enqueue's side: the same line refused the whole file ("1 invalid line(s),
    // nothing was enqueued"), where a punctuation-only line is published and refused per job.
    let env = TestEnv::new("fe_blank_line").await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("book.txt");
    std::fs::write(&file, "First line.\n\u{3000}\u{3000}\n。。。\nLast line.\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_voxbatch"))
        .args(["enqueue", file.to_str().unwrap(), "--campaign", "blank-line"])
        .env("RUST_LOG", "info")
        .env("VOXBATCH_AMQP__EXCHANGE", &env.cfg.amqp.exchange)
        .env("VOXBATCH_AMQP__QUEUE", &env.cfg.amqp.queue)
        .env("VOXBATCH_AMQP__DEAD_LETTER_EXCHANGE", &env.cfg.amqp.dead_letter_exchange)
        .env("VOXBATCH_AMQP__DEAD_LETTER_QUEUE", &env.cfg.amqp.dead_letter_queue)
        .env("DATABASE_URL", env.cfg.database.url.expose())
        .env("VOXBATCH_STORAGE__KEY_PREFIX", env.key_prefix())
        .env("VOXBATCH_METRICS__LISTEN", "off")
        .output()
        .unwrap();
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{all}");
    assert!(all.contains("enqueued 3 job(s)"), "{all}");
    assert!(all.contains("line 2 not enqueued: the line is only whitespace (U+3000)"), "{all}");
    assert!(!all.contains("nothing was enqueued"), "{all}");
    assert_eq!(env.depths().await, (3, 0), "the other lines, the punctuation-only one included, are published");
    env.cleanup().await;
}
