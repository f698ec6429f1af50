//! Text normalisation for Chinese and English, as CosyVoice's frontend does it
//! (`cosyvoice/cli/frontend.py`, `text_normalize` without ttsfrd): WeTextProcessing's FST grammars
//! (the `wetext` package's compiled `zh/tn` and `en/tn` tagger and verbaliser, run by `wetext-rs`;
//! the converter copies the files into the model directory, nothing is downloaded at run time),
//! then the reference's clean-ups — for Chinese: no line breaks, no blanks between Chinese
//! characters (but a blank between an English word or number and Chinese stays, where the
//! reference drops it: "我们 on 五月一日 at 三点", not "我们on五月一日at三点"), `²`/`³` read, `.` → `。`,
//! ` - ` → `，`, brackets removed, a trailing comma made a full stop; for English: digits the
//! grammar left spelled out as `inflect` spells them.
//!
//! Where the grammars read prices wrongly (`¥1,299.00` → "一元,两百九十九点零零", `$1,299.50` →
//! "thousand two hundred and ninety nine point five dollars", `$0.99` → "zero point nine nine
//! dollars") a pass before them rewrites money and digit-group commas: amounts become "N dollars
//! and M cents" / "N美元", thousands separators go, `.00` goes; `readings` writes out what both
//! the grammars and the reference read wrongly (St., phone numbers, versions, long digit strings).
//! A number is never read as "zero" for being too long: past what a person reads as a quantity it
//! is read digit by digit. `tests/data/normalize_cases.tsv` lists every case where the result
//! differs from the reference, and why.
//!
//! Each language's grammar is kept in as many copies as the caller asks (`pool`): one normalises
//! one text at a time, and the worker's frontend threads would otherwise queue on it.
//!
//! Neighbours: `frontend` calls [`Normalizer::normalize`] before `segment`; `rewrites` (this
//! module's own) holds the passes around the grammars (money, digit groups, English numbers,
//! decades, web addresses); `english` spells numbers; `readings` rewrites what the grammars
//! misread; `pool` holds the copies.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use regex::Regex;

use super::pool::Pool;
use super::readings;
use super::segment::Lang;

mod rewrites;
use rewrites::{decades, digit_groups, english_numbers, money_en, money_zh, spell_out_numbers, web_addresses};

/// Where the converted model keeps the grammars (`zh/tn/*.fst`, `en/tn/*.fst`).
pub const FST_DIR: &str = "fsts";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NormalizeError {
    #[error("text normalisation grammars missing: {0} (tools/convert_cosyvoice.py copies them from the `wetext` package)")]
    Missing(String),
    #[error("text normalisation failed: {0}")]
    Grammar(String),
}

/// The normaliser of one model: the grammars (each copy loaded on its first use).
pub struct Normalizer {
    zh: Pool<wetext_rs::Normalizer>,
    en: Pool<wetext_rs::Normalizer>,
}

/// Whether `text` has a CJK ideograph (the reference's `contains_chinese`).
pub fn contains_chinese(text: &str) -> bool {
    text.chars().any(|c| ('\u{4e00}'..='\u{9fff}').contains(&c))
}

impl Normalizer {
    /// The grammars under `dir` (a model directory's [`FST_DIR`]), one copy per language.
    pub fn new(dir: &Path) -> Result<Normalizer, NormalizeError> {
        Normalizer::with_copies(dir, 1)
    }

    /// The grammars under `dir`, `copies` of each language's (at least one), so that as many
    /// texts of one language are normalised at once.
    pub fn with_copies(dir: &Path, copies: usize) -> Result<Normalizer, NormalizeError> {
        for f in ["zh/tn/tagger.fst", "zh/tn/verbalizer.fst", "en/tn/tagger.fst", "en/tn/verbalizer.fst"] {
            if !dir.join(f).is_file() {
                return Err(NormalizeError::Missing(dir.join(f).display().to_string()));
            }
        }
        let make = |lang| {
            // As the reference constructs them: ZhNormalizer(remove_erhua=False, full_to_half=False), EnNormalizer().
            let config = wetext_rs::NormalizerConfig::new().with_lang(lang).with_remove_erhua(false).with_full_to_half(false);
            Pool::new((0..copies.max(1)).map(|_| wetext_rs::Normalizer::new(PathBuf::from(dir), config.clone())).collect())
        };
        Ok(Normalizer { zh: make(wetext_rs::Language::Zh), en: make(wetext_rs::Language::En) })
    }

    /// `text` normalised, and the rules its segments follow (Chinese when it has a Chinese
    /// character, as the reference decides). Blocking (FST composition): call it off the async runtime.
    pub fn normalize(&self, text: &str) -> Result<(String, Lang), NormalizeError> {
        let text = text.trim();
        if text.is_empty() {
            return Ok((String::new(), Lang::En));
        }
        // Full-width digits are read as digits (the reference reads them; the grammars and the
        // passes here, which match ASCII digits only, would leave them unread).
        let half_width;
        let text = if text.contains(|c| ('０'..='９').contains(&c)) {
            half_width = text.chars().map(|c| if ('０'..='９').contains(&c) { char::from(b'0' + (c as u32 - '０' as u32) as u8) } else { c }).collect::<String>();
            half_width.as_str()
        } else {
            text
        };
        if contains_chinese(text) {
            let text = digit_groups(&money_zh(text), false);
            let text = readings::long_digits_zh(&readings::phone_numbers(&readings::versions(&text, false), false));
            let text = run(&self.zh, &text, false)?;
            let text = replace_blank(&text.replace('\n', ""));
            let text = text.replace('²', "平方").replace('³', "立方").replace('.', "。").replace(" - ", "，");
            let text = remove_bracket(&text);
            Ok((trailing_comma().replace(&text, "。").into_owned(), Lang::Zh))
        } else {
            let text = readings::versions(&readings::phone_numbers(&readings::saint_or_street(text), true), true);
            let text = english_numbers(&decades(&web_addresses(&digit_groups(&money_en(&text), true))));
            let text = run(&self.en, &text, true)?;
            Ok((spell_out_numbers(&text), Lang::En))
        }
    }
}

/// The grammar over `text` a sentence at a time: composing a whole chapter at once costs ~7× more
/// (0.54 ms a character against 0.08 for a 4,000-character Chinese text), and no construct the
/// grammars read spans a sentence end. Whitespace between sentences is kept as written. A long
/// sentence goes to the grammar in [`pieces`], and an English piece of plain words skips it (the
/// grammar leaves such words as they are): a 19,000-digit number read digit by digit is one
/// 90,000-character sentence, a minute and a half of grammar in one piece.
fn run(pool: &Pool<wetext_rs::Normalizer>, text: &str, english: bool) -> Result<String, NormalizeError> {
    let mut n = pool.get().map_err(|_| NormalizeError::Grammar("a previous normalisation panicked".into()))?;
    let mut out = String::with_capacity(text.len() * 2);
    let mut grammar = |s: &str| n.normalize(s).map_err(|e| NormalizeError::Grammar(e.to_string()));
    for (space, sentence) in sentences(text) {
        out.push_str(space);
        for (space, piece) in pieces(sentence) {
            out.push_str(space);
            if piece.is_empty() {
                continue;
            }
            if english && plain_words(piece) {
                out.push_str(piece);
            } else if !english || piece.chars().any(|c| c.is_ascii_digit()) {
                out.push_str(&grammar(piece)?);
            } else {
                // wetext-rs leaves English without digits alone, where the reference still reads
                // its abbreviations and symbols ("Dr." → "doctor", "=" → "equals"): a digit makes it
                // run, and is taken off again. The digit comes after a symbol (" | 1", read
                // "vertical bar one") that nothing before it can join: a bare " 1" made "in Jan."
                // a date ("in the first of january"). Should the grammar still join them, the
                // piece stays as written.
                let read = grammar(&format!("{piece}{SENTINEL}"))?;
                out.push_str(read.strip_suffix(SENTINEL_READ).unwrap_or(piece));
            }
        }
    }
    Ok(out)
}

/// Bytes of a sentence after which [`pieces`] cuts it.
const PIECE_BYTES: usize = 400;

/// `sentence` cut for the grammar, as (leading whitespace, piece) pairs: after at least
/// [`PIECE_BYTES`], at the next space between two plain words (letters only), where no construct
/// the grammar reads (numbers, dates, units, abbreviations, symbols) can be cut. Most sentences
/// are one piece.
fn pieces(sentence: &str) -> Vec<(&str, &str)> {
    let letters = |w: Option<&str>| w.is_some_and(|w| !w.is_empty() && w.chars().all(char::is_alphabetic));
    let mut out = Vec::new();
    let (mut start, mut space) = (0, 0);
    for (i, c) in sentence.char_indices() {
        if !c.is_whitespace() || i < start + PIECE_BYTES || i <= space {
            continue;
        }
        let before = sentence[start..i].split_whitespace().next_back();
        let after = sentence[i..].split_whitespace().next();
        if letters(before) && letters(after) && !sentence[start..i].ends_with(char::is_whitespace) {
            out.push((&sentence[space..start], &sentence[start..i]));
            let rest = &sentence[i..];
            space = i;
            start = i + (rest.len() - rest.trim_start().len());
        }
    }
    out.push((&sentence[space..start], &sentence[start..]));
    out
}

/// Only letters, blanks and commas: nothing the English grammar reads.
fn plain_words(piece: &str) -> bool {
    piece.chars().all(|c| c.is_alphabetic() || c.is_whitespace() || c == ',')
}

/// Appended to an English sentence without digits so that the grammar runs over it, and what the
/// grammar makes of it.
const SENTINEL: &str = " | 1";
const SENTINEL_READ: &str = " vertical bar one";

/// Words whose `.` does not end a sentence (a month's, so that "Jan. 5th" is read as one date).
const ABBREVIATIONS: [&str; 30] = [
    "dr", "mr", "mrs", "ms", "st", "jr", "sr", "no", "vs", "etc", "prof", "inc", "ltd", "co", "mt", "e.g", "i.e", "u.s", "jan", "feb", "mar", "apr", "jun",
    "jul", "aug", "sep", "sept", "oct", "nov", "dec",
];

/// `text` cut after each sentence end — `。！？；!?` and line breaks, and `.` or `;` before
/// whitespace (not inside `3.5` or `v2.3`, not after an abbreviation such as `Dr.`) — as (leading
/// whitespace, sentence) pairs.
fn sentences(text: &str) -> Vec<(&str, &str)> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let next_is_space = chars.peek().is_none_or(|&(_, n)| n.is_whitespace());
        let abbreviation = || {
            let word = text[start..i].rsplit(char::is_whitespace).next().unwrap_or("").to_lowercase();
            ABBREVIATIONS.contains(&word.as_str())
        };
        let end = matches!(c, '。' | '！' | '？' | '；' | '!' | '?' | '\n') || (c == ';' && next_is_space) || (c == '.' && next_is_space && !abbreviation());
        if end {
            let piece = &text[start..i + c.len_utf8()];
            let body = piece.trim_start();
            out.push((&piece[..piece.len() - body.len()], body));
            start = i + c.len_utf8();
        }
    }
    let piece = &text[start..];
    let body = piece.trim_start();
    out.push((&piece[..piece.len() - body.len()], body));
    out
}

fn regex(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).unwrap_or_else(|e| panic!("built-in pattern {pattern}: {e}")))
}

fn trailing_comma() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    regex(&R, r"[，,、]+$")
}

/// The reference's `replace_blank` — a space stays between two non-space ASCII characters —
/// and, unlike it, between an ASCII letter or digit and a letter of another script, so that an
/// English word beside Chinese stays a word ("我们 on 五月 at 三pm", not "我们on五月at三pm"). A space
/// between two Chinese characters, or next to punctuation, goes as in the reference.
fn replace_blank(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    for (i, &c) in chars.iter().enumerate() {
        if c == ' ' {
            let at = |j: Option<usize>| j.and_then(|j| chars.get(j)).copied().filter(|&n| n != ' ');
            let (before, after) = (at(i.checked_sub(1)), at(i.checked_add(1)));
            let ascii = |n: Option<char>| n.is_some_and(|n| n.is_ascii());
            let word = |n: Option<char>| n.is_some_and(|n| n.is_ascii_alphanumeric());
            let other_letter = |n: Option<char>| n.is_some_and(|n| !n.is_ascii() && n.is_alphanumeric());
            let english_beside_chinese = (word(before) && other_letter(after)) || (other_letter(before) && word(after));
            if (ascii(before) && ascii(after)) || english_beside_chinese {
                out.push(c);
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The reference's `remove_bracket`.
fn remove_bracket(text: &str) -> String {
    text.replace(['（', '）', '【', '】', '`'], "").replace("——", " ")
}

#[cfg(test)]
mod tests;
