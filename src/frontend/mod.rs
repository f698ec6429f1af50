//! The text frontend of CosyVoice2 and CosyVoice3 jobs: a job's text → normalised text → segments
//! (the LLM's units) with their token ids, as CosyVoice's `frontend.text_normalize` +
//! `tokenizer.encode` do it (text with `<|…|>` markup is not normalised, as there).
//!
//! Stages, a file each: `normalize` (WeTextProcessing's grammars and the reference's clean-ups,
//! prices read right; its grammars in `pool`s of copies for parallel callers), `segment` (the reference's `split_paragraph`, plus a hard cap), `tokenizer`
//! (the Qwen2 tokenizer the converter writes), `english` (numbers in words), `readings` (what the
//! grammars misread: St., phone numbers, versions, long digit strings). Pieces that hold
//! only punctuation and symbols are dropped, as the reference drops them.
//!
//! Neighbours: `commands::text` (the dry run) and `model::tts::TextInput::prepare`
//! (which the worker's intake runs on each text job) call [`Frontend::prepare`];
//! `model::llm::prompt` turns the segments' tokens into LLM requests.

pub mod english;
pub mod normalize;
pub mod pool;
pub mod readings;
pub mod segment;
pub mod tokenizer;

use std::path::Path;

use normalize::{NormalizeError, Normalizer};
use segment::{Lang, SegmentLimits};
use tokenizer::{TextTokenizer, TokenizerError};

/// One unit of synthesis.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Segment {
    pub text: String,
    pub tokens: Vec<i64>,
}

/// What the frontend makes of one text.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Prepared {
    pub normalized: String,
    pub lang: Lang,
    pub segments: Vec<Segment>,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrontendError {
    #[error(transparent)]
    Normalize(#[from] NormalizeError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The text holds nothing to say (empty, or only punctuation and symbols once normalised).
    #[error("the text normalises to nothing to say")]
    Empty,
}

impl FrontendError {
    /// Whether the job's text is at fault (reject it) rather than the model's files.
    pub fn is_input(&self) -> bool {
        matches!(self, FrontendError::Empty | FrontendError::Tokenizer(TokenizerError::Encode(_)))
    }
}

pub struct Frontend {
    normalizer: Normalizer,
    tokenizer: TextTokenizer,
    limits: SegmentLimits,
}

impl Frontend {
    /// The frontend of a converted model directory (`tokenizer.json`, `fsts/`), segments within
    /// `limits`, for one caller at a time.
    pub fn load(model_dir: &Path, limits: SegmentLimits) -> Result<Frontend, FrontendError> {
        Frontend::load_for_threads(model_dir, limits, 1)
    }

    /// The same for `threads` callers at once (each language's grammar in as many copies).
    pub fn load_for_threads(model_dir: &Path, limits: SegmentLimits, threads: usize) -> Result<Frontend, FrontendError> {
        Ok(Frontend {
            normalizer: Normalizer::with_copies(&model_dir.join(normalize::FST_DIR), threads)?,
            tokenizer: TextTokenizer::load(&model_dir.join(tokenizer::TOKENIZER_FILE))?,
            limits,
        })
    }

    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// A voice prompt's transcript as the LLM is given it: normalised as one piece (the
    /// reference's `text_normalize(prompt_text, split=False)`) and tokenized. Blocking.
    pub fn prompt_tokens(&self, text: &str) -> Result<(String, Vec<i64>), FrontendError> {
        let (normalized, _) = self.normalize(text)?;
        if only_punctuation(&normalized) {
            return Err(FrontendError::Empty);
        }
        let tokens = self.tokenizer.encode(&normalized)?;
        if tokens.is_empty() {
            return Err(FrontendError::Empty);
        }
        Ok((normalized, tokens))
    }

    /// `text` normalised, segmented and tokenized. Blocking (grammars): off the async runtime.
    pub fn prepare(&self, text: &str) -> Result<Prepared, FrontendError> {
        let (normalized, lang) = self.normalize(text)?;
        let count = |s: &str| self.tokenizer.count(s);
        let mut segments = Vec::new();
        for piece in segment::split(&normalized, lang, &self.limits, &count) {
            if only_punctuation(&piece) {
                continue;
            }
            let tokens = self.tokenizer.encode(&piece)?;
            if !tokens.is_empty() {
                segments.push(Segment { text: piece, tokens });
            }
        }
        if segments.is_empty() {
            return Err(FrontendError::Empty);
        }
        Ok(Prepared { normalized, lang, segments })
    }

    /// `text` normalised, and its language; text with `<|…|>` markup ([`has_markup`]) as it is,
    /// as the reference's `text_normalize` leaves it (its language: Chinese if it holds any).
    fn normalize(&self, text: &str) -> Result<(String, Lang), FrontendError> {
        if has_markup(text) {
            let text = spoken_part(text);
            let lang = if normalize::contains_chinese(text) { Lang::Zh } else { Lang::En };
            return Ok((text.trim().to_string(), lang));
        }
        Ok(self.normalizer.normalize(text)?)
    }

    /// [`Frontend::prepare`] over `texts` on `threads` threads (each takes the next text; load the
    /// frontend [`Frontend::load_for_threads`] as many), the results in the texts' order. Blocking.
    pub fn prepare_all(&self, texts: &[&str], threads: usize) -> Vec<Result<Prepared, FrontendError>> {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let mut done: Vec<(usize, Result<Prepared, FrontendError>)> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads.clamp(1, texts.len().max(1)))
                .map(|_| {
                    scope.spawn(|| {
                        let mut mine = Vec::new();
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(text) = texts.get(i) else { break mine };
                            mine.push((i, self.prepare(text)));
                        }
                    })
                })
                .collect();
            // A panic inside `prepare` is a bug: it goes on up as it would have on one thread.
            workers.into_iter().flat_map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
        });
        done.sort_unstable_by_key(|(i, _)| *i);
        done.into_iter().map(|(_, r)| r).collect()
    }
}

/// Speaking rates (characters of normalised text a second, whitespace not counted): how long a
/// text will sound before it is synthesized — the dry run's estimate, the batch policy's measure of
/// a text job's work, and the forced lengths of benchmarks with random weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpeakingRates {
    pub zh_chars_per_second: f64,
    pub en_chars_per_second: f64,
}

impl SpeakingRates {
    /// Speech tokens a second of audio (CosyVoice2's speech tokenizer runs at 25 Hz).
    pub const TOKENS_PER_SECOND: f64 = 25.0;

    pub fn from_config(f: &crate::config::FrontendConfig) -> SpeakingRates {
        SpeakingRates { zh_chars_per_second: f.zh_chars_per_second, en_chars_per_second: f.en_chars_per_second }
    }

    /// Seconds `text` (normalised, in `lang`) takes to say.
    pub fn audio_seconds(&self, text: &str, lang: Lang) -> f64 {
        let rate = match lang {
            Lang::Zh => self.zh_chars_per_second,
            Lang::En => self.en_chars_per_second,
        };
        text.chars().filter(|c| !c.is_whitespace()).count() as f64 / rate
    }

    /// Speech tokens of `text` (at least one).
    pub fn speech_tokens(&self, text: &str, lang: Lang) -> usize {
        ((self.audio_seconds(text, lang) * Self::TOKENS_PER_SECOND).ceil() as usize).max(1)
    }
}

/// Whether `text` holds `<|…|>` markup (language tags such as `<|en|>`, `<|endofprompt|>`): the
/// reference skips text normalisation for such text (`text_normalize`: "skip text_frontend when
/// ssml symbol in text"), and so does [`Frontend::prepare`]; it still segments it.
pub fn has_markup(text: &str) -> bool {
    match text.find("<|") {
        Some(start) => text[start..].contains("|>"),
        None => false,
    }
}

/// What of `text` is to be spoken: all of it, or what follows a prompt the text writes itself
/// (`"You are a helpful assistant.<|endofprompt|>…"`, as the reference's CosyVoice3 examples
/// write cross-lingual text) — the model puts its own prompt before each segment.
fn spoken_part(text: &str) -> &str {
    use tokenizer::END_OF_PROMPT;
    match text.rfind(END_OF_PROMPT) {
        Some(at) => &text[at + END_OF_PROMPT.len()..],
        None => text,
    }
}

/// The reference's `is_only_punctuation`: nothing but punctuation and symbols (or whitespace,
/// which the reference's pattern does not list but which says nothing either).
pub fn only_punctuation(text: &str) -> bool {
    text.chars().all(|c| c.is_whitespace() || is_punctuation_or_symbol(c))
}

/// Unicode general categories P* and S*, approximated without a Unicode table: ASCII
/// punctuation and symbols, general punctuation, CJK symbols, full-width forms' punctuation,
/// currency, arrows, maths, dingbats and emoji ranges.
fn is_punctuation_or_symbol(c: char) -> bool {
    c.is_ascii_punctuation()
        || matches!(c as u32,
            0x00A1..=0x00BF | 0x00D7 | 0x00F7 | 0x2010..=0x2BFF | 0x3000..=0x3004 | 0x3008..=0x3020 | 0x3030..=0x303F | 0x30FB | 0xFE10..=0xFE6F
            | 0xFF01..=0xFF0F | 0xFF1A..=0xFF20 | 0xFF3B..=0xFF40 | 0xFF5B..=0xFF65 | 0xFFE0..=0xFFEE | 0x1F000..=0x1FAFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_is_a_tag_opened_before_it_closes() {
        assert!(has_markup("<|en|>Hello there."));
        assert!(has_markup("You are a helpful assistant.<|endofprompt|>[breath]因为"));
        assert!(!has_markup("a |> b <| c"), "closed before it opens");
        assert!(!has_markup("x < y | z > w"));
        assert_eq!(spoken_part("You are a helpful assistant.<|endofprompt|>[breath]因为"), "[breath]因为");
        assert_eq!(spoken_part("<|en|>Hello."), "<|en|>Hello.");
    }

    #[test]
    fn punctuation_only_pieces_are_recognised() {
        assert!(only_punctuation("。。。！？"));
        assert!(only_punctuation("... —— ！！！"));
        assert!(!only_punctuation("好。"));
        assert!(!only_punctuation("a."));
    }
}
