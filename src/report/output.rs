//! How every command prints what it found: one table style for people, JSON for programs, and
//! CSV where the data is one table. A command's result type implements [`Render`]; the binary
//! calls [`render`] with the `--format` it was given and prints the string.
//!
//! Text is for terminals, so nothing a publisher chose (a campaign, a reason, a transcript) may
//! reach one raw: every [`Table`] cell goes through [`escape_controls`], and `Render::text`
//! implementations escape what they write outside tables. JSON escapes control characters itself.
//!
//! Neighbours: `commands::*` (the result types), `main.rs` (prints).

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use super::ParseError;
use crate::job::escape_controls;

/// Output formats (`--format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Sentences and aligned tables, for people.
    Table,
    /// One table as CSV (reports, lists).
    Csv,
    /// Pretty-printed JSON.
    Json,
}

impl FromStr for Format {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        match s {
            "table" | "text" => Ok(Format::Table),
            "csv" => Ok(Format::Csv),
            "json" => Ok(Format::Json),
            other => Err(ParseError { value: other.to_string(), expected: "table, csv or json" }),
        }
    }
}

/// What a command prints.
pub trait Render: Serialize {
    /// For people: sentences and [`Table`]s, ending with a newline, every field a publisher
    /// controls escaped.
    fn text(&self) -> String;
    /// The same as CSV, where it is one table (`None`: it is not).
    fn csv(&self) -> Option<String> {
        None
    }
}

/// `--format csv` for an output that is not one table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--format csv: this command's output is not one table; use table or json")]
pub struct NoCsv;

/// `value` in `format`, ending with a newline.
pub fn render<T: Render + ?Sized>(value: &T, format: Format) -> Result<String, NoCsv> {
    match format {
        Format::Table => Ok(value.text()),
        Format::Csv => value.csv().ok_or(NoCsv),
        Format::Json => Ok(json(value)),
    }
}

/// `value` as pretty JSON and a newline.
pub fn json<T: Serialize + ?Sized>(value: &T) -> String {
    let mut s = serde_json::to_string_pretty(value).unwrap_or_else(|e| format!("{{\"error\": {:?}}}", e.to_string()));
    s.push('\n');
    s
}

/// `value` as one line of JSON (a line per refresh of `status --watch`).
pub fn json_line<T: Serialize + ?Sized>(value: &T) -> String {
    let mut s = serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\": {:?}}}", e.to_string()));
    s.push('\n');
    s
}

/// The one table style: a header of column names (the JSON/CSV field names, never truncated),
/// then one line per row; columns two spaces apart, numbers right-aligned, the last column
/// unpadded (free text goes last). Every cell is escaped when added.
#[derive(Debug, Clone, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<S: AsRef<str>>(headers: impl IntoIterator<Item = S>) -> Table {
        Table { headers: headers.into_iter().map(|h| escape_controls(h.as_ref())).collect(), rows: Vec::new() }
    }

    /// Adds a row (missing cells are empty, extra ones dropped).
    pub fn row<S: AsRef<str>>(&mut self, cells: impl IntoIterator<Item = S>) -> &mut Table {
        let mut row: Vec<String> = cells.into_iter().take(self.headers.len()).map(|c| escape_controls(c.as_ref())).collect();
        row.resize(self.headers.len(), String::new());
        self.rows.push(row);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as CSV: the header line, then the rows (cells quoted where needed).
    pub fn csv(&self) -> String {
        let line = |cells: &[String]| {
            let quoted: Vec<String> =
                cells.iter().map(|c| if c.contains([',', '"', '\n', '\r']) { format!("\"{}\"", c.replace('"', "\"\"")) } else { c.clone() }).collect();
            quoted.join(",") + "\n"
        };
        std::iter::once(&self.headers).chain(&self.rows).map(|r| line(r)).collect()
    }
}

/// A cell that reads as a number (or stands for none): right-aligned.
fn numeric(cell: &str) -> bool {
    cell == "-" || cell.trim_start_matches('$').trim_end_matches('%').parse::<f64>().is_ok()
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.headers.len();
        let width = |c: &str| c.chars().count();
        let widths: Vec<usize> = (0..n).map(|i| self.rows.iter().map(|r| width(&r[i])).chain([width(&self.headers[i])]).max().unwrap_or(0)).collect();
        // Right-aligned: a column of numbers (and dashes for none), at least one a number.
        let right: Vec<bool> = (0..n)
            .map(|i| self.rows.iter().all(|r| r[i].is_empty() || numeric(&r[i])) && self.rows.iter().any(|r| r[i] != "-" && numeric(&r[i])))
            .collect();
        for row in std::iter::once(&self.headers).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = " ".repeat(widths[i] - width(cell));
                if right[i] {
                    line.push_str(&pad);
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    if i + 1 < n {
                        line.push_str(&pad);
                    }
                }
            }
            writeln!(f, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_escape_every_cell_and_never_truncate_headers() {
        let mut t = Table::new(["campaign", "jobs", "usd_per_million_chars", "reason"]);
        t.row(["book", "12", "33.33", "too long"]);
        t.row(["evil\n2026-12-03T00:00:00Z  INFO forged\u{1b}[2J", "3", "-", "a, \"quoted\" reason"]);
        let text = t.to_string();
        assert_eq!(text.lines().count(), 3, "one line per row, the newline escaped: {text}");
        assert!(!text.contains('\u{1b}') && text.contains("evil\\n2026"), "{text}");
        let header = text.lines().next().unwrap();
        assert!(header.starts_with("campaign") && header.contains("usd_per_million_chars") && header.ends_with("reason"));
        // Numbers are right-aligned under their header's end.
        let end = header.find("jobs").unwrap() + "jobs".len();
        assert!(text.lines().skip(1).all(|l| l[..end].ends_with(|c: char| c.is_ascii_digit())), "{text}");
        let csv = t.csv();
        assert!(csv.starts_with("campaign,jobs,usd_per_million_chars,reason\n"), "{csv}");
        assert!(csv.contains("\"a, \"\"quoted\"\" reason\"") && !csv.contains('\u{1b}'), "{csv}");
        assert_eq!("json".parse::<Format>().unwrap(), Format::Json);
        assert!("yaml".parse::<Format>().is_err());
    }
}
