//! The `voxbatch` binary: help, configuration through the environment, enqueue and status.

use crate::common;

use std::process::{Command, Output};

use common::TestEnv;

pub(crate) fn voxbatch(env: &[(&str, String)], args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_voxbatch"));
    cmd.args(args).env("RUST_LOG", "info");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run voxbatch")
}

pub(crate) fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Environment variables that point the binary at a test's own queues, database and prefix.
pub(crate) fn test_env_vars(env: &TestEnv) -> Vec<(&'static str, String)> {
    vec![
        ("VOXBATCH_AMQP__EXCHANGE", env.cfg.amqp.exchange.clone()),
        ("VOXBATCH_AMQP__QUEUE", env.cfg.amqp.queue.clone()),
        ("VOXBATCH_AMQP__DEAD_LETTER_EXCHANGE", env.cfg.amqp.dead_letter_exchange.clone()),
        ("VOXBATCH_AMQP__DEAD_LETTER_QUEUE", env.cfg.amqp.dead_letter_queue.clone()),
        ("DATABASE_URL", env.cfg.database.url.expose().to_string()),
        ("VOXBATCH_STORAGE__KEY_PREFIX", env.key_prefix()),
        ("VOXBATCH_MODEL__DIR", env.cfg.model.dir.display().to_string()),
        ("VOXBATCH_METRICS__LISTEN", "off".to_string()),
    ]
}

#[test]
fn every_command_has_help() {
    for cmd in [vec!["--help"], vec!["migrate", "--help"], vec!["enqueue", "--help"], vec!["work", "--help"], vec!["status", "--help"], vec!["report", "--help"], vec!["demo", "--help"]] {
        let o = voxbatch(&[], &cmd);
        assert!(o.status.success(), "{cmd:?}: {}", text(&o));
        assert!(text(&o).contains("Usage: voxbatch"), "{cmd:?}");
    }
    // Flags and arguments that said nothing (every one is checked by the binary's unit test
    // `every_flag_and_argument_of_every_command_has_help`).
    for (cmd, says) in [
        (vec!["cancel", "--help"], vec!["The campaign to cancel", "Undo a cancel"]),
        (vec!["voice", "list", "--help"], vec!["model directory whose voices", "Every model's voices"]),
        (vec!["voice", "show", "--help"], vec!["The voice's name", "the voice belongs to"]),
        (vec!["voice", "rm", "--help"], vec!["The voice's name", "the voice belongs to"]),
    ] {
        let o = voxbatch(&[], &cmd);
        let out = text(&o);
        assert!(o.status.success() && says.iter().all(|s| out.contains(s)), "{cmd:?}: {out}");
    }
}

#[test]
fn an_empty_or_malformed_campaign_is_refused_before_anything_runs() {
    for args in [vec!["status", "--campaign", ""], vec!["status", "--campaign", "a/b", "--watch"], vec!["cancel", "--campaign", ""]] {
        let o = voxbatch(&[], &args);
        assert!(!o.status.success() && text(&o).contains("--campaign") && text(&o).contains("must be 1-"), "{args:?}: {}", text(&o));
    }
}

#[tokio::test]
async fn enqueue_with_the_broker_unreachable_gives_up_after_publish_give_up_saying_what_was_published() {
    let env = TestEnv::new("enqgiveup").await;
    let mut vars = test_env_vars(&env);
    // Nothing listens on port 1: every connection is refused at once.
    vars.push(("AMQP_URL", "amqp://guest:guest@127.0.0.1:1/%2f".into()));
    vars.push(("VOXBATCH_AMQP__PUBLISH_GIVE_UP", "2s".into()));
    vars.push(("VOXBATCH_AMQP__RECONNECT_MIN", "100ms".into()));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("two.txt");
    std::fs::write(&file, "One line.\nAnother line.\n").unwrap();
    let started = std::time::Instant::now();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_voxbatch"));
    cmd.args(["enqueue", file.to_str().unwrap(), "--campaign", "give-up"]).env("RUST_LOG", "warn").kill_on_drop(true);
    for (k, v) in &vars {
        cmd.env(k, v);
    }
    let o = tokio::time::timeout(std::time::Duration::from_secs(60), cmd.output()).await.expect("enqueue gave up within a minute").unwrap();
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(started.elapsed() >= std::time::Duration::from_secs(2), "it tried for the time it was given");
    let error = out.lines().find(|l| l.starts_with("error: ")).unwrap_or_else(|| panic!("an error line: {out}"));
    assert!(error.contains("RabbitMQ unreachable for 2s") && error.contains("amqp.publish_give_up"), "{out}");
    assert!(error.contains("0 of 2 job(s) of the file published") && error.contains("--campaign give-up --skip 0"), "{out}");
    env.cleanup().await;
}

#[tokio::test]
async fn enqueue_publishes_every_line_and_status_and_work_see_them() {
    let env = TestEnv::new("cli").await;
    let vars = test_env_vars(&env);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jobs.txt");
    std::fs::write(&file, "First line.\n\nSecond line.\n第三行。\n").unwrap();

    let o = voxbatch(&vars, &["enqueue", file.to_str().unwrap(), "--campaign", "cli-test", "--voice", "narrator"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("enqueued 3 job(s)"), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("cli-test (3)"), "{}", text(&o));
    assert_eq!(env.depths().await, (3, 0));

    let o = voxbatch(&vars, &["status"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("queue {}: 3 ready", env.cfg.amqp.queue)), "{}", text(&o));

    let o = voxbatch(&vars, &["work", "--drain"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("3 job(s) done"), "{}", text(&o));

    // The same file again: the same ids, so nothing is synthesized or billed twice.
    let o = voxbatch(&vars, &["enqueue", file.to_str().unwrap(), "--campaign", "cli-test", "--voice", "narrator"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = voxbatch(&vars, &["work", "--drain"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("0 job(s) done, 0 failed, 3 already done"), "{}", text(&o));
    assert_eq!(env.objects().await.len(), 3);

    let o = voxbatch(&vars, &["report", "--campaign", "cli-test", "--format", "csv"]);
    assert!(o.status.success(), "{}", text(&o));
    let csv = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(csv.lines().nth(1).unwrap_or("").starts_with("cli-test,3,"), "{csv}");
    assert!(csv.lines().nth(2).unwrap_or("").starts_with("TOTAL,3,"), "{csv}");

    let plots = tempfile::tempdir().unwrap();
    for (name, magic) in [("r.svg", &b"<svg"[..]), ("r.png", &b"\x89PNG"[..])] {
        let path = plots.path().join(name);
        let o = voxbatch(&vars, &["report", "--campaign", "cli-test", "--plot", path.to_str().unwrap()]);
        assert!(o.status.success(), "{}", text(&o));
        assert!(std::fs::read(&path).unwrap().starts_with(magic), "{name}");
    }
    let o = voxbatch(&vars, &["report", "--plot", plots.path().join("r.gif").to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains(".svg or .png"), "{}", text(&o));
    env.cleanup().await;
}

#[tokio::test]
async fn a_file_with_a_bad_line_is_refused_whole_and_nothing_is_enqueued() {
    let env = TestEnv::new("clibad").await;
    let vars = test_env_vars(&env);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jobs.jsonl");
    std::fs::write(&file, "{\"text\":\"ok\"}\n{\"text\":42}\n").unwrap();
    let o = voxbatch(&vars, &["enqueue", file.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("line 2") && text(&o).contains("not a string"), "{}", text(&o));
    assert_eq!(env.depths().await, (0, 0));
    env.cleanup().await;
}

#[test]
fn credentials_never_appear_in_logs_or_errors() {
    let secret_pw = "pw-Zq81sEcReT";
    let secret_key = "key-Wx44sEcReT";
    let o = voxbatch(
        &[
            ("RUST_LOG", "trace".to_string()),
            ("AMQP_URL", format!("amqp://guest:{secret_pw}@127.0.0.1:5672/%2f")),
            ("DATABASE_URL", format!("postgres://postgres:{secret_pw}@127.0.0.1:5432/vbt_never")),
            ("AWS_SECRET_ACCESS_KEY", secret_key.to_string()),
        ],
        &["status"],
    );
    let out = text(&o);
    assert!(!o.status.success(), "the broker refuses the wrong password");
    assert!(out.contains("127.0.0.1:5672"), "the error names the broker: {out}");
    assert!(!out.contains(secret_pw), "password leaked: {out}");
    assert!(!out.contains(secret_key), "secret key leaked: {out}");
}

#[tokio::test]
async fn refused_credentials_end_the_command_at_once_with_what_to_check() {
    let env = TestEnv::new("badcreds").await;
    let started = std::time::Instant::now();
    // A wrong broker password: the worker does not reconnect forever.
    let mut vars = test_env_vars(&env);
    vars.push(("AMQP_URL", "amqp://guest:wrong-password@127.0.0.1:5672/%2f".into()));
    let o = voxbatch(&vars, &["work", "--drain"]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("hint: RabbitMQ refused"), "{out}");
    assert!(!out.contains("wrong-password"), "{out}");
    // enqueue does not retry refused credentials for minutes either.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("one.txt");
    std::fs::write(&file, "One line.\n").unwrap();
    let o = voxbatch(&vars, &["enqueue", file.to_str().unwrap()]);
    let out = text(&o);
    assert!(!o.status.success() && out.contains("hint: RabbitMQ refused"), "{out}");
    // A wrong S3 secret: one line naming S3 and the refusal, not a debug dump.
    let mut vars = test_env_vars(&env);
    vars.push(("AWS_SECRET_ACCESS_KEY", "not-the-secret".into()));
    let o = voxbatch(&vars, &["work", "--drain"]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("hint: S3 refused"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("error: ") && l.contains("s3 ") && l.contains("HTTP 403")), "{out}");
    assert!(!out.contains("not-the-secret"), "{out}");
    // A role Postgres does not know (28000): refused, not retried.
    let mut vars = test_env_vars(&env);
    vars.retain(|(k, _)| *k != "DATABASE_URL");
    vars.push(("DATABASE_URL", "postgres://no_such_role_vbt@127.0.0.1:5432/vbt_never".into()));
    let o = voxbatch(&vars, &["work", "--drain"]);
    let out = text(&o);
    assert!(!o.status.success() && out.contains("hint: Postgres refused"), "{out}");
    assert!(started.elapsed() < std::time::Duration::from_secs(60), "all ended at once");
    env.cleanup().await;
}

#[tokio::test]
async fn an_interrupted_enqueue_prints_the_exact_command_that_resumes_it_and_that_command_publishes_the_rest_once() {
    let env = TestEnv::new("enqint").await;
    let vars = test_env_vars(&env);
    let dir = tempfile::tempdir().unwrap();
    // A name the shell must quote: the printed command has to survive it.
    let file = dir.path().join("the book's lines.txt");
    let total = 60_000;
    let lines: String = (0..total).map(|i| format!("Line number {i} of a long backlog.\n")).collect();
    std::fs::write(&file, lines).unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_voxbatch"));
    cmd.args(["enqueue", file.to_str().unwrap(), "--campaign", "book-42", "--voice", "narrator"])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in &vars {
        cmd.env(k, v);
    }
    let child = cmd.spawn().unwrap();
    // Interrupt once publishing is under way.
    let started = std::time::Instant::now();
    while env.depths().await.0 == 0 && started.elapsed() < std::time::Duration::from_secs(30) {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // SAFETY: sends SIGTERM to our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let o = child.wait_with_output().unwrap();
    let out = text(&o);
    assert_eq!(o.status.code(), Some(130), "{out}");
    let published: usize = out
        .split("interrupted: ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("says how many: {out}"));
    assert!(published > 0 && published < total, "{out}");
    assert_eq!(env.depths().await.0 as usize, published, "exactly what it said it published");
    // The printed command: every flag given (the campaign and voice are part of the derived ids).
    let resume = out.split("Resume with `").nth(1).and_then(|r| r.split('`').next()).unwrap_or_else(|| panic!("a command: {out}"));
    assert!(resume.contains("--campaign book-42 --voice narrator") && resume.ends_with(&format!("--skip {published}")), "{resume}");
    assert!(resume.contains("'") && resume.contains("the book"), "the file name quoted for the shell: {resume}");
    let mut sh = std::process::Command::new("sh");
    sh.args(["-c", resume]).env("RUST_LOG", "warn");
    for (k, v) in &vars {
        sh.env(k, v);
    }
    let o = sh.output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(env.depths().await.0 as usize, total, "every line once");
    // All in the campaign the first run was given, as a correct rerun would have it.
    let by_campaign: Vec<(String, i64)> =
        sqlx::query_as("SELECT campaign, sum(jobs)::int8 FROM campaign_enqueues GROUP BY campaign").fetch_all(env.db.pool()).await.unwrap();
    assert_eq!(by_campaign, vec![("book-42".to_string(), total as i64)]);
    env.cleanup().await;
}

#[tokio::test]
async fn control_characters_in_a_rejected_message_never_reach_the_log_raw_and_secrets_in_query_strings_are_redacted() {
    let env = TestEnv::new("inject").await;
    let vars = test_env_vars(&env);
    let evil = "\u{1b}[2J\n2026-12-03T00:00:00Z  INFO forged line";
    let body = serde_json::json!({ "job_id": uuid::Uuid::new_v4().to_string(), "text": "hi", "voice": evil, "campaign": evil }).to_string();
    env.publish_raw(&[body.as_bytes()]).await;
    let o = voxbatch(&vars, &["work", "--drain"]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{err}");
    assert!(err.contains("rejecting message"), "{err}");
    assert!(!err.contains('\u{1b}'), "an escape sequence reached the log: {err:?}");
    assert!(!err.lines().any(|l| l.starts_with("2026-12-03T00:00:00Z")), "a forged line: {err}");
    // A password in the query string of DATABASE_URL is redacted like one in the authority.
    let mut vars = test_env_vars(&env);
    vars.retain(|(k, _)| *k != "DATABASE_URL");
    vars.push(("DATABASE_URL", "postgres://postgres@127.0.0.1:1/vbt_never?password=Qs-Secret-77".into()));
    let o = voxbatch(&vars, &["status"]);
    let out = text(&o);
    assert!(out.contains("Postgres: UNREACHABLE"), "{out}");
    assert!(!out.contains("Qs-Secret-77"), "{out}");
    // audit refuses a campaign that would match every object.
    let o = voxbatch(&test_env_vars(&env), &["audit", "--campaign", ""]);
    assert!(!o.status.success() && text(&o).contains("name one campaign"), "{}", text(&o));
    env.cleanup().await;
}
