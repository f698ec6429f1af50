//! House rules no code path enforces, checked over the repository itself: the project names dates,
//! commits and files, never numbered working sessions (a reader has none of them), and README.md
//! stays a short guide whose first code block holds the two commands (`make demo`, `make test`).
//!
//! Both read the checkout at `CARGO_MANIFEST_DIR`. The first asks `git grep` for the tracked files,
//! so it needs git and a work tree; a source tree without them skips it and says so.

use std::path::Path;
use std::process::Command;

/// The repository root: this crate's manifest directory.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Whether git runs here and the root is inside a work tree.
fn in_a_git_work_tree() -> bool {
    Command::new("git")
        .args(["rev-parse", "--is-inside-work-tree"])
        .current_dir(root())
        .output()
        .map(|out| out.status.success())
        .unwrap_or(false)
}

#[test]
fn no_file_of_the_project_speaks_of_session_numbers() {
    if !in_a_git_work_tree() {
        eprintln!("skipped: {} is not a git work tree (or git is missing)", root().display());
        return;
    }
    // Every tracked text file but Cargo.lock and the benches' raw output under bench/results/.
    let out = Command::new("git")
        .args(["grep", "-nIiE", r"\bsessions? [0-9]+", "--", ".", ":(exclude)Cargo.lock", ":(exclude)bench/results"])
        .current_dir(root())
        .output()
        .expect("git grep could not be started");
    // git grep exits 0 when it found lines, 1 when it found none, anything else on an error.
    match out.status.code() {
        Some(1) => {}
        Some(0) => {
            let hits = String::from_utf8_lossy(&out.stdout);
            panic!(
                "{} line(s) speak of a numbered session; a reader has no sessions: name a date, a commit or a file instead\n{hits}",
                hits.lines().count()
            );
        }
        _ => panic!("git grep failed: {}", String::from_utf8_lossy(&out.stderr)),
    }
}

#[test]
fn the_readme_stays_a_short_guide() {
    let path = root().join("README.md");
    let readme = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let lines = readme.lines().count();
    assert!(lines <= 250, "README.md has {lines} lines: keep it a guide of at most 250 and move the rest to a page under docs/");
    let first_block = first_code_block(&readme).expect("README.md has no code block");
    for command in ["make demo", "make test"] {
        assert!(first_block.contains(command), "README.md's first code block lacks `{command}`:\n{first_block}");
    }
}

#[test]
fn the_first_code_block_is_read_between_the_first_two_fences() {
    let text = "# title\n\nprose\n\n```sh\nmake demo\nmake test\n```\n\n```sh\nother\n```\n";
    assert_eq!(first_code_block(text).as_deref(), Some("make demo\nmake test"));
    assert_eq!(first_code_block("no code here\n"), None);
}

/// The lines between the first fence line (one starting with three backticks) and the next, as
/// the repository's before-stop hook reads them; None without a fence.
fn first_code_block(markdown: &str) -> Option<String> {
    let mut lines = markdown.lines().skip_while(|line| !line.starts_with("```"));
    lines.next()?;
    let body: Vec<&str> = lines.take_while(|line| !line.starts_with("```")).collect();
    Some(body.join("\n"))
}
