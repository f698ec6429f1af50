//! Readings that WeTextProcessing's grammars get wrong — and so does the reference, which runs the
//! same grammars — written out before the grammars run (issue 39): "St." as Street or Saint, phone
//! numbers, version strings, and digit strings too long to be a quantity, which are read digit by
//! digit (an order number of twenty digits is not "zero", nor half a number and half digits).
//!
//! Each pass takes text and gives text, touching only what it reads; what it leaves stays for the
//! grammar. `tests/data/normalize_cases.tsv` has a row for each, with the reference's reading and
//! why ours differs.
//!
//! Neighbours: `normalize` runs them (English ones before the English grammar, Chinese ones
//! before the Chinese grammar); `english` spells the numbers.

use std::sync::OnceLock;

use regex::{Captures, Regex};

use super::english::{digit_words, number_words};

/// English digit runs longer than this are read digit by digit: nobody says a sixteen-digit
/// number as "one quadrillion …"; it is an order, card or account number.
pub const EN_MAX_CARDINAL_DIGITS: usize = 15;

/// Chinese digit runs longer than this are read digit by digit: the Chinese grammar reads up to
/// twelve digits (千亿) as a number and garbles longer ones (`1234567890123` →
/// "幺二三四五六千七百八十九万零一百二十三").
pub const ZH_MAX_CARDINAL_DIGITS: usize = 12;

fn regex(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).unwrap_or_else(|e| panic!("built-in pattern {pattern}: {e}")))
}

/// `text` with each match of `re` replaced by what `read(captures, before, after)` gives; a match
/// it gives `None` for stays as written.
fn replace_where(text: &str, re: &Regex, mut read: impl FnMut(&Captures<'_>, &str, &str) -> Option<String>) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    let mut last = 0;
    for c in re.captures_iter(text) {
        let Some(m) = c.get(0) else { continue };
        if let Some(r) = read(&c, &text[..m.start()], &text[m.end()..]) {
            out.push_str(&text[last..m.start()]);
            out.push_str(&r);
            last = m.end();
        }
    }
    out.push_str(&text[last..]);
    out
}

/// Whether a match between `before` and `after` stands alone as a number: no digit, `.`, `-` or
/// `,` joining it to more digits on either side (`1-555-0123`, `192.168.1.1`, `555-0123-9`).
fn standalone(before: &str, after: &str) -> bool {
    let joined_before = before.chars().next_back().is_some_and(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | ','));
    let mut ahead = after.chars();
    let joined_after = match ahead.next() {
        Some(c) if c.is_ascii_digit() => true,
        Some('.' | '-' | ',') => ahead.next().is_some_and(|c| c.is_ascii_digit()),
        _ => false,
    };
    !joined_before && !joined_after
}

/// "St." as a person reads it: "Saint" before a name ("St. Louis", "We visited St. Paul's"),
/// "Street" after one ("221 Baker St.", "Main St. is closed"). A name before it is a capitalised
/// word or a house number that neither starts nor ends its sentence; otherwise a capitalised word after it
/// makes it Saint, and anything else Street. The abbreviation's full stop goes, except where it
/// also ends the sentence (Street at the end of the text or before a capital).
pub fn saint_or_street(text: &str) -> String {
    static R: OnceLock<Regex> = OnceLock::new();
    replace_where(text, regex(&R, r"\bSt\."), |_, before, after| {
        let capitalised = |w: &str| w.chars().next().is_some_and(char::is_uppercase);
        let next = after.split_whitespace().next();
        let next_capital = next.is_some_and(capitalised);
        let mut words = before.split_whitespace().rev();
        let prev = words.next();
        let prev_starts_sentence = words.next().is_none_or(|w| w.ends_with(['.', '!', '?', ':']));
        let prev_is_name = prev.is_some_and(|w| w.chars().next().is_some_and(|c| c.is_uppercase() || c.is_ascii_digit()) && !w.ends_with(['.', '!', '?']))
            && !prev_starts_sentence;
        if next_capital && !prev_is_name {
            return Some("Saint".into());
        }
        Some(if next.is_none() || next_capital { "Street." } else { "Street" }.into())
    })
}

/// Phone numbers read digit by digit in groups, 0 as "oh": `555-0123` → "five five five, oh one
/// two three", `(555) 012-3456` → "five five five, oh one two, three four five six" (the grammar
/// reads "five hundred fifty five-oh one two three", and 0 as "zero"). In Chinese, digits without
/// pauses, 1 as 幺 as the grammar reads phone numbers: `555-0123` → "五五五零幺二三" (the grammar:
/// "五百五十五减零一百二十三"). Two round numbers (`100-1000`, `500-2000`) are a range, not a phone number.
pub fn phone_numbers(text: &str, english: bool) -> String {
    static R: OnceLock<Regex> = OnceLock::new();
    replace_where(text, regex(&R, r"(?:\(([0-9]{3})\)\s?|([0-9]{3})-)?([0-9]{3})-([0-9]{4})"), |c, before, after| {
        let area = c.get(1).or(c.get(2)).map(|m| m.as_str());
        let (exchange, line) = (&c[3], &c[4]);
        let opening_bracket = c[0].starts_with('(');
        if !standalone(if opening_bracket { "" } else { before }, after) {
            return None;
        }
        let round = |s: &str, zeros: usize| s.len() > zeros && !s.starts_with('0') && s.ends_with(&"0".repeat(zeros));
        if area.is_none() && round(exchange, 1) && round(line, 2) && exchange.parse::<u32>().ok() < line.parse::<u32>().ok() {
            return None;
        }
        let groups = area.into_iter().chain([exchange, line]);
        Some(if english {
            groups.map(|g| digit_words(g, "oh")).collect::<Vec<_>>().join(", ")
        } else {
            groups.map(|g| zh_digits(g, '幺')).collect()
        })
    })
}

/// Version strings of three parts up to three digits each (`2.0.1`, `v2.10.3`), not a fourth
/// (an address such as `192.168.1.1` is not one): in English each part a number, 0 and a
/// leading zero as "oh" ("two point oh point one"; the grammar reads "two.zero point one"); in
/// Chinese "二点零点一" (the grammar leaves a `.`, which the reference's clean-up makes a full
/// stop: "v二。三点一"). A letter right before (`v2.0.1`, `iOS17.4.1`) stays, a space after it in
/// English.
pub fn versions(text: &str, english: bool) -> String {
    static R: OnceLock<Regex> = OnceLock::new();
    replace_where(text, regex(&R, r"([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})"), |c, before, after| {
        if !standalone(before, after) {
            return None;
        }
        let parts = [&c[1], &c[2], &c[3]];
        if english {
            let part = |p: &str| if p.starts_with('0') { digit_words(p, "oh") } else { number_words(p.parse().unwrap_or(0)) };
            let space = if before.chars().next_back().is_some_and(char::is_alphanumeric) { " " } else { "" };
            Some(format!("{space}{}", parts.map(part).join(" point ")))
        } else {
            // As the grammar reads a decimal: the first part a number, the others digit by digit.
            let first = parts[0].parse::<u32>().ok().filter(|&n| n < 100 && !(parts[0].len() > 1 && parts[0].starts_with('0')));
            let head = first.map_or_else(|| zh_digits(parts[0], '一'), zh_below_hundred);
            Some(format!("{head}点{}点{}", zh_digits(parts[1], '一'), zh_digits(parts[2], '一')))
        }
    })
}

/// Chinese digit runs longer than [`ZH_MAX_CARDINAL_DIGITS`] read digit by digit, 1 as 幺 as the
/// grammar reads the long digit strings it recognises (`18446744073709551616` →
/// "幺八四四六七四四零七三七零九五五幺六幺六"; the grammar: "幺八四四六七四四零七三七亿零九百五十五万一千六百一十六").
/// The digits after a decimal point are the grammar's.
pub fn long_digits_zh(text: &str) -> String {
    static R: OnceLock<Regex> = OnceLock::new();
    let pattern = format!(r"[0-9]{{{},}}", ZH_MAX_CARDINAL_DIGITS + 1);
    replace_where(text, regex(&R, &pattern), |c, before, _| {
        let fraction = before.ends_with('.') && before[..before.len() - 1].ends_with(|ch: char| ch.is_ascii_digit());
        (!fraction).then(|| zh_digits(&c[0], '幺'))
    })
}

const ZH_DIGITS: [char; 10] = ['零', '一', '二', '三', '四', '五', '六', '七', '八', '九'];

/// Digits one by one in Chinese, `one` for 1 (幺 in phone and code numbers).
fn zh_digits(digits: &str, one: char) -> String {
    digits.chars().filter_map(|c| c.to_digit(10)).map(|d| if d == 1 { one } else { ZH_DIGITS[d as usize] }).collect()
}

/// 0…99 as a Chinese number (十, 十五, 二十, 二十三).
fn zh_below_hundred(n: u32) -> String {
    let (tens, ones) = ((n / 10) as usize, (n % 10) as usize);
    let mut s = String::new();
    match tens {
        0 => return ZH_DIGITS[ones].to_string(),
        1 => s.push('十'),
        t => {
            s.push(ZH_DIGITS[t]);
            s.push('十');
        }
    }
    if ones > 0 {
        s.push(ZH_DIGITS[ones]);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saint_before_a_name_street_after_one() {
        for (text, read) in [
            ("He lives at 221 Baker St.", "He lives at 221 Baker Street."),
            ("He lives at 221 Baker St. in London.", "He lives at 221 Baker Street in London."),
            ("Baker St. is busy.", "Baker Street is busy."),
            ("St. Louis is big.", "Saint Louis is big."),
            ("We visited St. Paul's Cathedral.", "We visited Saint Paul's Cathedral."),
            ("Visit St. Paul's.", "Visit Saint Paul's."),
            ("It is on Main St. The shop is open.", "It is on Main Street. The shop is open."),
            ("I saw Paris. St. Louis was next.", "I saw Paris. Saint Louis was next."),
            ("Ernst. Stone.", "Ernst. Stone."),
        ] {
            assert_eq!(saint_or_street(text), read, "{text}");
        }
    }

    #[test]
    fn phone_numbers_are_read_in_digit_groups() {
        assert_eq!(phone_numbers("Call 555-0123.", true), "Call five five five, oh one two three.");
        assert_eq!(phone_numbers("Call (555) 012-3456 now", true), "Call five five five, oh one two, three four five six now");
        assert_eq!(phone_numbers("Call 555-012-3456", true), "Call five five five, oh one two, three four five six");
        assert_eq!(phone_numbers("电话555-0123。", false), "电话五五五零幺二三。");
        for left in ["It took 100-1000 tries.", "1-555-0123", "555-01234", "2024-0101", "ISBN 978-3-16-148410-0"] {
            assert_eq!(phone_numbers(left, true), left, "{left}");
        }
    }

    #[test]
    fn three_part_versions_are_read_as_versions() {
        assert_eq!(versions("Version 2.0.1 is out.", true), "Version two point oh point one is out.");
        assert_eq!(versions("Upgrade to v2.10.3 today.", true), "Upgrade to v two point ten point three today.");
        assert_eq!(versions("版本号是v2.3.1。", false), "版本号是v二点三点一。");
        assert_eq!(versions("版本10.0.12", false), "版本十点零点一二");
        for left in ["Ping 192.168.1.1 now.", "It is 3.14 now.", "Born 12.05.1990."] {
            assert_eq!(versions(left, true), left, "{left}");
        }
    }

    #[test]
    fn long_chinese_digit_strings_are_read_digit_by_digit() {
        assert_eq!(long_digits_zh("订单18446744073709551616已发货"), "订单幺八四四六七四四零七三七零九五五幺六幺六已发货");
        assert_eq!(long_digits_zh("共123456789012人"), "共123456789012人", "twelve digits are the grammar's number");
        assert_eq!(long_digits_zh("π是3.14159265358979323846"), "π是3.14159265358979323846", "decimals are the grammar's");
        let other_digits = "订单١٢٣٤٥٦٧٨٩٠١٢٣٤"; // Arabic-Indic: not read here, and never dropped
        assert_eq!(long_digits_zh(other_digits), other_digits);
        assert_eq!(phone_numbers("Call ５５５-０１２３", true), "Call ５５５-０１２３");
    }
}
