//! Segmenting normalised text into the LLM's units, as CosyVoice's `split_paragraph`
//! (`cosyvoice/utils/frontend_utils.py`, token max 80 / min 60 / merge under 20): sentences end at
//! the language's stop punctuation (a closing quote right after stays with its sentence),
//! sentences are gathered while the segment stays within `max` (a segment is closed once it holds
//! more than `min`), and a last piece under `merge` joins the one before. Lengths are characters
//! for Chinese and tokens otherwise.
//!
//! One deliberate difference: the reference never splits a sentence, however long. A segment
//! still over `hard_max` tokens after the reference's rules (the LLM's slots are sized for
//! `[llm] max_text_tokens`) is cut at its last comma that fits, else at its last space that fits,
//! else between characters — so no text is lost and no segment outgrows its slot.
//!
//! Neighbours: `frontend` (normalises first, calls [`split`]); `tokenizer` counts tokens.

/// Which rules: Chinese (character lengths, Chinese and ASCII stops) or other (token lengths).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Lang {
    Zh,
    En,
}

/// The reference's limits plus the hard cap.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SegmentLimits {
    pub max: usize,
    pub min: usize,
    pub merge: usize,
    /// Tokens a segment may never exceed.
    pub hard_max: usize,
}

impl SegmentLimits {
    /// The configured limits: `[frontend]` segment sizes, capped at `[llm] max_text_tokens` (what
    /// a slot is sized for).
    pub fn from_config(c: &crate::config::Config) -> SegmentLimits {
        let f = &c.frontend;
        SegmentLimits { max: f.segment_max_tokens, min: f.segment_min_tokens, merge: f.segment_merge_tokens, hard_max: c.llm.max_text_tokens }
    }
}

impl Default for SegmentLimits {
    fn default() -> Self {
        SegmentLimits { max: 80, min: 60, merge: 20, hard_max: 80 }
    }
}

const ZH_STOPS: &[char] = &['。', '？', '！', '；', '：', '、', '.', '?', '!', ';'];
const EN_STOPS: &[char] = &['.', '?', '!', ';', ':'];
const CLOSING_QUOTES: &[char] = &['"', '”'];
const COMMAS: &[char] = &['，', ',', '、', '；', ';', '：', ':'];

/// `text` in segments (see the module doc); `tokens` counts a piece's tokens. Empty text gives none.
pub fn split(text: &str, lang: Lang, limits: &SegmentLimits, tokens: &dyn Fn(&str) -> usize) -> Vec<String> {
    let length = |s: &str| match lang {
        Lang::Zh => s.chars().count(),
        Lang::En => tokens(s),
    };
    let stops = match lang {
        Lang::Zh => ZH_STOPS,
        Lang::En => EN_STOPS,
    };
    let mut chars: Vec<char> = text.chars().collect();
    let Some(&last) = chars.last() else { return Vec::new() };
    if !stops.contains(&last) {
        chars.push(if lang == Lang::Zh { '。' } else { '.' });
    }
    // Sentences: up to and including each stop (a stop right after another adds nothing, as in
    // the reference), a closing quote after a stop kept with it.
    let mut sentences: Vec<String> = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < chars.len() {
        if stops.contains(&chars[i]) {
            if i > start {
                sentences.push(chars[start..=i].iter().collect());
            }
            if i + 1 < chars.len() && CLOSING_QUOTES.contains(&chars[i + 1]) {
                if let Some(s) = sentences.last_mut() {
                    s.push(chars[i + 1]);
                }
                start = i + 2;
                i += 1;
            } else {
                start = i + 1;
            }
        }
        i += 1;
    }
    let mut segments: Vec<String> = Vec::new();
    let mut current = String::new();
    for s in sentences {
        if length(&format!("{current}{s}")) > limits.max && length(&current) > limits.min {
            segments.push(std::mem::take(&mut current));
        }
        current.push_str(&s);
    }
    if !current.is_empty() {
        match segments.last_mut() {
            Some(last) if length(&current) < limits.merge => last.push_str(&current),
            _ => segments.push(current),
        }
    }
    segments.into_iter().flat_map(|s| cap(&s, limits.hard_max, tokens)).collect()
}

/// `s` cut into pieces of at most `hard_max` tokens: at the last comma that fits, else the last
/// space, else between characters (see the module doc). Each cut looks only at a window of the
/// text ahead that holds more than `hard_max` tokens, so a long sentence (a 19,000-digit number
/// read digit by digit is 90,000 characters) is cut in time proportional to its length.
fn cap(s: &str, hard_max: usize, tokens: &dyn Fn(&str) -> usize) -> Vec<String> {
    let hard_max = hard_max.max(1);
    let mut out = Vec::new();
    let mut rest: &str = s;
    // Characters a window starts with: more than `hard_max` tokens' worth for most text.
    let first_window = hard_max.saturating_mul(8);
    loop {
        let mut chars = first_window;
        let window = loop {
            let end = rest.char_indices().nth(chars).map_or(rest.len(), |(i, _)| i);
            if tokens(&rest[..end]) > hard_max {
                break Some(end);
            }
            if end == rest.len() {
                break None;
            }
            chars = chars.saturating_mul(2);
        };
        let Some(window) = window else { break };
        let bounds: Vec<usize> = rest[..window].char_indices().map(|(i, c)| i + c.len_utf8()).collect();
        // The longest prefix (in characters) within the cap.
        let fits = bounds.partition_point(|&end| tokens(&rest[..end]) <= hard_max);
        let limit = bounds[fits.max(1) - 1];
        let head = &rest[..limit];
        let cut = head
            .char_indices()
            .filter(|(_, c)| COMMAS.contains(c))
            .map(|(i, c)| i + c.len_utf8())
            .next_back()
            .or_else(|| head.char_indices().filter(|(_, c)| c.is_whitespace()).map(|(i, _)| i).rfind(|&i| i > 0))
            .unwrap_or(limit);
        out.push(rest[..cut].trim_end().to_string());
        rest = rest[cut..].trim_start();
    }
    if !rest.is_empty() {
        out.push(rest.to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> usize {
        s.split_whitespace().count()
    }

    #[test]
    fn chinese_sentences_gather_up_to_the_limits_and_a_short_tail_merges() {
        let limits = SegmentLimits { max: 10, min: 6, merge: 4, hard_max: 100 };
        // 5 + 5 characters fit (10), the third would exceed 10 with 10 > 6 held: closed.
        let got = split("你好世界啊。今天天气好！我们去公园吧。好", Lang::Zh, &limits, &|s| s.chars().count());
        assert_eq!(got, vec!["你好世界啊。今天天气好！", "我们去公园吧。好。"], "the tail 好。 merges into the last");
    }

    #[test]
    fn a_closing_quote_stays_with_its_sentence_and_a_stop_is_added_at_the_end() {
        let limits = SegmentLimits { max: 3, min: 1, merge: 1, hard_max: 100 };
        let got = split("He said \"go.\" Then he left", Lang::En, &limits, &words);
        assert_eq!(got, vec!["He said \"go.\"", " Then he left."]);
        assert!(split("", Lang::En, &limits, &words).is_empty());
    }

    #[test]
    fn a_sentence_over_the_hard_cap_is_cut_at_commas_then_spaces_and_nothing_is_lost() {
        let limits = SegmentLimits { max: 80, min: 60, merge: 20, hard_max: 4 };
        let got = split("one two, three four five six seven", Lang::En, &limits, &words);
        assert_eq!(got, vec!["one two,", "three four five six", "seven."]);
        assert!(got.iter().all(|s| words(s) <= 4));
        // Unbroken Chinese: cut between characters.
        let zh = split("一二三四五六七八九十", Lang::Zh, &limits, &|s| s.chars().count());
        assert_eq!(zh.concat(), "一二三四五六七八九十。");
        assert!(zh.iter().all(|s| s.chars().count() <= 4), "{zh:?}");
    }
}
