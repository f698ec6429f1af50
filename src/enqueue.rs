//! Reading job files for `voxbatch enqueue`: `.txt` (one job per non-empty line) and `.jsonl`
//! (one job object per line; `job_id` optional).
//!
//! Two streaming passes, so a file of any size is never held in memory: [`JobFile::scan`]
//! validates every line and hashes the file (a file with a bad line is refused whole, with each
//! bad line's number and reason, so nothing is half-enqueued); [`JobFile::read`] then yields the
//! jobs. A line without a `job_id` gets one derived from the file ([`derived_job_id`]: UUIDv5 of
//! campaign, the file's SHA-256 and the line number), so enqueuing the same file twice publishes
//! the same ids and workers settle the second copy without synthesizing it again.
//!
//! A line of only whitespace is not a job: ASCII blank lines are skipped silently; a line that
//! looks blank but is not empty (U+3000, a no-break or zero-width space) is left out and reported
//! per line ([`JobFile::left_out`]), and the other lines go ahead — it never refuses the file.
//! [`read_lines`] reads a whole file or stream in one pass for `voxbatch text` (standard input is
//! read as it comes, never copied to a file). An interrupted run is resumed by [`resume_command`]:
//! the same command with `--skip N`.
//!
//! Neighbours: `job` validates each line; `commands::enqueue` publishes through `queue::Publisher`;
//! `commands::text` previews the jobs.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::config::Limits;
use crate::job::{is_blank, parse_job, Job, Rejection, DEFAULT_CAMPAIGN};

/// Errors reading a job file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnqueueError {
    #[error("cannot read {path}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: unknown file type; use .txt (one job per line) or .jsonl (one JSON job per line)")]
    UnknownFormat { path: String },
    #[error("{path}: {count} invalid line(s), nothing was enqueued:\n{details}")]
    InvalidLines { path: String, count: usize, details: String },
    #[error("{path}: no jobs (no line has anything to say)")]
    Empty { path: String },
    #[error("{path} changed while it was being enqueued; run the command again")]
    Changed { path: String },
}

/// Defaults applied to lines that do not set them.
#[derive(Debug, Clone, Default)]
pub struct LineDefaults {
    pub campaign: Option<String>,
    pub voice: Option<String>,
    /// `speed` (CosyVoice2 models), validated with the line like any job field.
    pub speed: Option<f64>,
}

/// Namespace of the ids derived for lines without a `job_id`.
pub const JOB_ID_NAMESPACE: Uuid = Uuid::from_u128(0x5d1c_9a52_7f0e_4a8b_9c36_0b1e_7a4d_c2f1);

/// The id of line `line` (1-based) of a file whose content hashes to `file_sha256`, for a job of
/// `campaign`: UUIDv5 in [`JOB_ID_NAMESPACE`] of `<campaign>\n<sha256 hex>\n<line>`.
pub fn derived_job_id(campaign: &str, file_sha256: &str, line: usize) -> Uuid {
    Uuid::new_v5(&JOB_ID_NAMESPACE, format!("{campaign}\n{file_sha256}\n{line}").as_bytes())
}

/// How a job file's lines are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineFormat {
    /// A job's text a line (`.txt`).
    Text,
    /// A job object a line (`.jsonl`, `.ndjson`).
    Json,
    /// Objects if the first line with something on it starts with `{`, else text (standard input).
    Detect,
}

impl LineFormat {
    /// The format of `path` by its extension.
    pub fn of_path(path: &Path) -> Result<LineFormat, EnqueueError> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("txt") => Ok(LineFormat::Text),
            Some("jsonl") | Some("ndjson") => Ok(LineFormat::Json),
            _ => Err(EnqueueError::UnknownFormat { path: path.display().to_string() }),
        }
    }
}

/// One line of a job file with something on it.
enum Line {
    /// The job's body, defaults applied (not yet validated).
    Body(Vec<u8>),
    /// Only whitespace that is not ASCII (U+3000, …): why it is not a job.
    Blank(String),
}

/// A validated job file.
#[derive(Debug, Clone)]
pub struct JobFile {
    pub path: PathBuf,
    format: LineFormat,
    defaults: LineDefaults,
    limits: Limits,
    /// Jobs in the file.
    pub jobs: usize,
    /// Hex SHA-256 of the file's bytes.
    pub sha256: String,
    /// Lines left out, with why (line number, reason): lines of only whitespace that are not
    /// empty (U+3000, …). Not jobs, and not a reason to refuse the file.
    pub left_out: Vec<(usize, String)>,
}

impl JobFile {
    /// Reads the whole file once, validating every line and hashing it. Blocking.
    pub fn scan(path: &Path, defaults: &LineDefaults, limits: &Limits) -> Result<JobFile, EnqueueError> {
        let shown = path.display().to_string();
        let format = LineFormat::of_path(path)?;
        let mut file = JobFile {
            path: path.to_path_buf(),
            format,
            defaults: defaults.clone(),
            limits: limits.clone(),
            jobs: 0,
            sha256: String::new(),
            left_out: Vec::new(),
        };
        let mut errors: Vec<(usize, Rejection)> = Vec::new();
        let mut left_out = Vec::new();
        let mut count = 0;
        let sha256 = file.each_line(|n, line| {
            match line {
                Line::Blank(why) => left_out.push((n, why)),
                Line::Body(body) => match parse_job(&body, &file.limits, false) {
                    Ok(_) => count += 1,
                    Err(e) => errors.push((n, e)),
                },
            }
            true
        })?;
        if !errors.is_empty() {
            return Err(invalid_lines(shown, &errors));
        }
        if count == 0 {
            return Err(EnqueueError::Empty { path: shown });
        }
        file.jobs = count;
        file.sha256 = sha256;
        file.left_out = left_out;
        Ok(file)
    }

    /// Reads the jobs again, each with its id, passing them to `each` in order (`false` from
    /// `each` stops early). Blocking. Fails if the file changed since [`JobFile::scan`].
    pub fn read(&self, mut each: impl FnMut(Job) -> bool) -> Result<(), EnqueueError> {
        let mut stopped = false;
        let sha = self.each_line(|n, line| {
            if stopped {
                return false;
            }
            let Line::Body(body) = line else { return true };
            let body = with_derived_id(body, &self.sha256, n);
            if let Ok(job) = parse_job(&body, &self.limits, false) {
                stopped = !each(job);
            }
            !stopped
        })?;
        if !stopped && sha != self.sha256 {
            return Err(EnqueueError::Changed { path: self.path.display().to_string() });
        }
        Ok(())
    }

    /// [`each_line`] over the file.
    fn each_line(&self, f: impl FnMut(usize, Line) -> bool) -> Result<String, EnqueueError> {
        let read_err = |source| EnqueueError::Read { path: self.path.display().to_string(), source };
        let reader = BufReader::new(File::open(&self.path).map_err(read_err)?);
        each_line(reader, self.format, &self.defaults, f).map_err(read_err)
    }
}

/// Calls `f(line number, line)` for each line of `reader` with something on it until `f` returns
/// false (ASCII blank lines are skipped); returns the hex SHA-256 of what was read.
fn each_line(mut reader: impl BufRead, mut format: LineFormat, defaults: &LineDefaults, mut f: impl FnMut(usize, Line) -> bool) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    let mut line = Vec::new();
    let mut n = 0;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        hasher.update(&line);
        n += 1;
        let content = line.strip_suffix(b"\n").unwrap_or(&line);
        let content = content.strip_suffix(b"\r").unwrap_or(content);
        if content.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let line = match std::str::from_utf8(content) {
            Ok(text) if is_blank(text) => Line::Blank(only_whitespace(text)),
            _ => {
                if format == LineFormat::Detect {
                    let opening = content.strip_prefix("\u{feff}".as_bytes()).unwrap_or(content).trim_ascii_start();
                    format = if opening.starts_with(b"{") { LineFormat::Json } else { LineFormat::Text };
                }
                Line::Body(if format == LineFormat::Json { with_defaults_jsonl(content, defaults) } else { with_defaults_txt(content, defaults) })
            }
        };
        if !f(n, line) {
            break;
        }
    }
    Ok(hex::encode(hasher.finalize()))
}

/// Why a line of only (non-ASCII) whitespace is not a job, naming what is on it.
fn only_whitespace(text: &str) -> String {
    let mut seen: Vec<char> = Vec::new();
    for c in text.chars().filter(|c| !c.is_ascii_whitespace()) {
        if !seen.contains(&c) {
            seen.push(c);
        }
    }
    let names: Vec<String> = seen.iter().take(4).map(|&c| format!("U+{:04X}", c as u32)).collect();
    format!("the line is only whitespace ({}): nothing to say", names.join(" "))
}

/// The error for invalid lines: each one's number and reason (the first 20).
fn invalid_lines(path: String, errors: &[(usize, Rejection)]) -> EnqueueError {
    let count = errors.len();
    let mut details: Vec<String> = errors.iter().take(20).map(|(n, e)| format!("  line {n}: {e}")).collect();
    if count > 20 {
        details.push(format!("  … and {} more", count - 20));
    }
    EnqueueError::InvalidLines { path, count, details: details.join("\n") }
}

/// A line of a job file as [`read_lines`] gives it.
#[derive(Debug, Clone, PartialEq)]
pub enum ReadLine {
    /// A job (line number, job), with the id `enqueue` gives it.
    Job { line: usize, job: Job },
    /// A line that is not a job, and why (only whitespace).
    LeftOut { line: usize, why: String },
}

/// Every line of `reader` (named `name` in errors) in one pass, validated as [`JobFile::scan`]
/// validates a file: the jobs with the ids `enqueue` would give them (ids derive from the bytes,
/// so they are known once all are read) and the lines left out, in order. Invalid lines refuse
/// the whole input ([`EnqueueError::InvalidLines`]), as `enqueue` would refuse it. Blocking; reads
/// standard input as it comes, without a copy on disk.
pub fn read_lines(reader: impl Read, name: &str, format: LineFormat, defaults: &LineDefaults, limits: &Limits) -> Result<Vec<ReadLine>, EnqueueError> {
    let mut bodies: Vec<(usize, Result<Vec<u8>, String>)> = Vec::new();
    let mut errors: Vec<(usize, Rejection)> = Vec::new();
    let sha256 = each_line(BufReader::new(reader), format, defaults, |n, line| {
        match line {
            Line::Blank(why) => bodies.push((n, Err(why))),
            Line::Body(body) => match parse_job(&body, limits, false) {
                Ok(_) => bodies.push((n, Ok(body))),
                Err(e) => errors.push((n, e)),
            },
        }
        true
    })
    .map_err(|source| EnqueueError::Read { path: name.to_string(), source })?;
    if !errors.is_empty() {
        return Err(invalid_lines(name.to_string(), &errors));
    }
    if bodies.is_empty() {
        return Err(EnqueueError::Empty { path: name.to_string() });
    }
    Ok(bodies
        .into_iter()
        .filter_map(|(n, body)| match body {
            Err(why) => Some(ReadLine::LeftOut { line: n, why }),
            Ok(body) => parse_job(&with_derived_id(body, &sha256, n), limits, false).ok().map(|job| ReadLine::Job { line: n, job }),
        })
        .collect())
}

/// Reads and validates every job of `path` into memory (small files, tests).
pub fn read_jobs(path: &Path, defaults: &LineDefaults, limits: &Limits) -> Result<Vec<Job>, EnqueueError> {
    let file = JobFile::scan(path, defaults, limits)?;
    let mut jobs = Vec::with_capacity(file.jobs);
    file.read(|j| {
        jobs.push(j);
        true
    })?;
    Ok(jobs)
}

/// Adds the derived `job_id` to a job body that has none.
fn with_derived_id(body: Vec<u8>, file_sha256: &str, line: usize) -> Vec<u8> {
    let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(&body) else { return body };
    if obj.get("job_id").is_some_and(|v| !v.is_null()) {
        return body;
    }
    let campaign = obj.get("campaign").and_then(Value::as_str).unwrap_or(DEFAULT_CAMPAIGN).to_string();
    obj.insert("job_id".into(), Value::String(derived_job_id(&campaign, file_sha256, line).to_string()));
    serde_json::to_vec(&Value::Object(obj)).unwrap_or(body)
}

fn insert_defaults(obj: &mut serde_json::Map<String, Value>, defaults: &LineDefaults) {
    for (field, value) in [("campaign", &defaults.campaign), ("voice", &defaults.voice)] {
        if let Some(v) = value {
            obj.entry(field).or_insert_with(|| Value::String(v.clone()));
        }
    }
    if let Some(speed) = defaults.speed.and_then(serde_json::Number::from_f64) {
        obj.entry("speed").or_insert(Value::Number(speed));
    }
}

fn with_defaults_txt(line: &[u8], defaults: &LineDefaults) -> Vec<u8> {
    let Ok(text) = std::str::from_utf8(line) else {
        return line.to_vec(); // parse_job reports the invalid UTF-8
    };
    let mut obj = serde_json::Map::new();
    obj.insert("text".into(), Value::String(text.trim().to_string()));
    insert_defaults(&mut obj, defaults);
    serde_json::to_vec(&Value::Object(obj)).unwrap_or_else(|_| line.to_vec())
}

fn with_defaults_jsonl(line: &[u8], defaults: &LineDefaults) -> Vec<u8> {
    match serde_json::from_slice::<Value>(line) {
        Ok(Value::Object(mut obj)) => {
            insert_defaults(&mut obj, defaults);
            serde_json::to_vec(&Value::Object(obj)).unwrap_or_else(|_| line.to_vec())
        }
        _ => line.to_vec(), // parse_job reports what is wrong
    }
}

/// The command that resumes an interrupted `enqueue` run of `args` (the process's arguments, the
/// program first) after `published` jobs of its file: the same arguments — every flag kept, as
/// `--campaign` and `--voice` change the derived job ids — with `--skip` set to `published`, each
/// argument quoted for a POSIX shell.
pub fn resume_command(args: &[String], published: usize) -> String {
    let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let mut out: Vec<String> = Vec::with_capacity(args.len() + 2);
    let mut i = 0;
    while i < end {
        let a = &args[i];
        if a == "--skip" {
            i += 2;
            continue;
        }
        if !a.starts_with("--skip=") {
            out.push(a.clone());
        }
        i += 1;
    }
    out.push("--skip".into());
    out.push(published.to_string());
    out.extend(args[end..].iter().cloned());
    out.iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" ")
}

/// `s` as one word of a POSIX shell: as is when it is plain, else in single quotes (`$'…'` with
/// escapes when it holds control characters, so none reaches the terminal raw).
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "@%+=:,./_-".contains(c));
    if plain {
        return s.to_string();
    }
    if s.chars().any(char::is_control) {
        let body: String = s
            .chars()
            .map(|c| match c {
                '\\' => "\\\\".to_string(),
                '\'' => "\\'".to_string(),
                c if c.is_control() && (c as u32) < 0x100 => format!("\\x{:02x}", c as u32),
                c if c.is_control() => format!("\\u{:04x}", c as u32),
                c => c.to_string(),
            })
            .collect();
        return format!("$'{body}'");
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resume_command_keeps_every_flag_and_quotes_each_word() {
        let args: Vec<String> = ["target/debug/voxbatch", "--config", "my conf.toml", "enqueue", "book's lines.txt", "--campaign", "book-42", "--voice", "narrator", "--skip", "10", "--speed=1.25"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            resume_command(&args, 512),
            "target/debug/voxbatch --config 'my conf.toml' enqueue 'book'\\''s lines.txt' --campaign book-42 --voice narrator --speed=1.25 --skip 512"
        );
        let eq: Vec<String> = ["voxbatch", "enqueue", "a.txt", "--skip=3", "--", "-odd.txt"].iter().map(|s| s.to_string()).collect();
        assert_eq!(resume_command(&eq, 7), "voxbatch enqueue a.txt --skip 7 -- -odd.txt");
        assert_eq!(shell_quote("a\nb\u{1b}[2J'"), "$'a\\x0ab\\x1b[2J\\''");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn txt_lines_become_jobs_with_the_given_campaign_and_voice() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.txt");
        std::fs::write(&p, "Hello world.\n\n  你好，世界。 \r\n").unwrap();
        let d = LineDefaults { campaign: Some("book".into()), voice: Some("narrator".into()), speed: Some(1.25) };
        let jobs = read_jobs(&p, &d, &Limits::default()).unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[1].text, "你好，世界。");
        assert!(jobs.iter().all(|j| j.campaign == "book" && j.voice == "narrator" && j.speed == Some(1.25)));
        assert_ne!(jobs[0].job_id, jobs[1].job_id);
        let again = read_jobs(&p, &d, &Limits::default()).unwrap();
        assert_eq!(jobs, again, "enqueuing the same file twice gives the same ids");
        std::fs::write(&p, "Hello world.\n\n  你好，世界！ \r\n").unwrap();
        let edited = read_jobs(&p, &d, &Limits::default()).unwrap();
        assert_ne!(edited[0].job_id, jobs[0].job_id, "another file content, other ids");
        let other = LineDefaults { campaign: Some("other".into()), ..d };
        assert_ne!(read_jobs(&p, &other, &Limits::default()).unwrap()[0].job_id, edited[0].job_id, "ids depend on the campaign");
    }

    #[test]
    fn a_line_of_only_unicode_whitespace_is_left_out_with_why_and_the_rest_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let d = LineDefaults::default();
        for (name, content) in [("a.txt", "First.\n\u{3000}\nSecond.\n"), ("a.jsonl", "{\"text\":\"First.\"}\n\u{3000}\u{a0}\n{\"text\":\"Second.\"}\n")] {
            let p = dir.path().join(name);
            std::fs::write(&p, content).unwrap();
            let file = JobFile::scan(&p, &d, &Limits::default()).unwrap();
            assert_eq!(file.jobs, 2, "{name}");
            assert_eq!(file.left_out.len(), 1, "{name}");
            assert_eq!(file.left_out[0].0, 2);
            assert!(file.left_out[0].1.contains("U+3000") && file.left_out[0].1.contains("only whitespace"), "{:?}", file.left_out);
            let jobs = read_jobs(&p, &d, &Limits::default()).unwrap();
            assert_eq!(jobs.iter().map(|j| j.text.as_str()).collect::<Vec<_>>(), ["First.", "Second."]);
            // The same lines read in one pass (as `voxbatch text` reads standard input): the same
            // jobs with the same ids, and the line left out in its place.
            let lines = read_lines(std::fs::File::open(&p).unwrap(), name, LineFormat::Detect, &d, &Limits::default()).unwrap();
            assert_eq!(lines.len(), 3);
            assert_eq!(lines[0], ReadLine::Job { line: 1, job: jobs[0].clone() });
            assert!(matches!(&lines[1], ReadLine::LeftOut { line: 2, why } if why.contains("U+3000")), "{:?}", lines[1]);
            assert_eq!(lines[2], ReadLine::Job { line: 3, job: jobs[1].clone() });
        }
        let p = dir.path().join("blank.txt");
        std::fs::write(&p, "\u{3000}\n\u{200b}\n").unwrap();
        assert!(matches!(JobFile::scan(&p, &d, &Limits::default()), Err(EnqueueError::Empty { .. })), "nothing to say at all: no jobs");
    }

    #[test]
    fn jsonl_keeps_its_own_fields_and_bad_lines_refuse_the_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.jsonl");
        std::fs::write(&p, "{\"text\":\"a\",\"campaign\":\"own\",\"speed\":0.5}\n{\"text\":\"b\"}\n").unwrap();
        let d = LineDefaults { campaign: Some("flag".into()), voice: None, speed: Some(2.0) };
        let jobs = read_jobs(&p, &d, &Limits::default()).unwrap();
        assert_eq!((jobs[0].campaign.as_str(), jobs[1].campaign.as_str()), ("own", "flag"));
        assert_eq!((jobs[0].speed, jobs[1].speed), (Some(0.5), Some(2.0)), "a line's own speed, else the flag's");
        let too_fast = LineDefaults { speed: Some(3.0), ..d.clone() };
        assert!(read_jobs(&p, &too_fast, &Limits::default()).unwrap_err().to_string().contains("speed"), "a bad --speed refuses the file");
        std::fs::write(&p, "{\"text\":\"a\"}\nnot json\n{\"text\":\"\"}\n").unwrap();
        let e = read_jobs(&p, &d, &Limits::default()).unwrap_err().to_string();
        assert!(e.contains("2 invalid line(s)") && e.contains("line 2") && e.contains("line 3"), "{e}");
        let q = dir.path().join("a.csv");
        std::fs::write(&q, "x").unwrap();
        assert!(matches!(read_jobs(&q, &d, &Limits::default()), Err(EnqueueError::UnknownFormat { .. })));
    }
}
