//! The passes around WeTextProcessing's grammars (`super`): before them, money and digit-group
//! commas rewritten (amounts as "N dollars and M cents" / "N美元", thousands separators dropped);
//! for English, number ranges, units, decades and web addresses read as the reference reads
//! them; after them, the digits the grammar left spelled out as `inflect` spells them.

use std::sync::OnceLock;

use regex::Regex;

use super::regex;
use crate::frontend::english::{cardinal_or_digits, digit_words, number_words};
use crate::frontend::readings;

/// Numbers written with thousands separators: `1,234,567` → `1234567` for the Chinese grammar
/// (which reads it right); spelled out for English (`1,234` → "one thousand two hundred and thirty
/// four"), where the grammar drops the first word ("thousand two hundred…") and reads four digits
/// without commas as a year ("twelve thirty four").
pub(super) fn digit_groups(text: &str, english: bool) -> String {
    static R: OnceLock<Regex> = OnceLock::new();
    regex(&R, r"(?-u:\b)[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?(?-u:\b)").replace_all(text, |c: &regex::Captures<'_>| {
        let plain = c[0].replace(',', "");
        if !english {
            return plain;
        }
        let (whole, decimals) = plain.split_once('.').map_or((plain.as_str(), ""), |(w, d)| (w, d));
        let whole = cardinal_or_digits(whole);
        if decimals.is_empty() {
            whole
        } else {
            format!("{whole} point {}", digits_words(decimals))
        }
    })
    .into_owned()
}

/// An amount's digits without thousands separators.
pub(super) fn amount(m: &str) -> String {
    m.replace(',', "")
}

/// A decimal part without trailing zeros (`50` → `5`, `00` → empty).
pub(super) fn trimmed_decimals(d: Option<regex::Match<'_>>) -> String {
    d.map_or(String::new(), |m| m.as_str().trim_end_matches('0').to_string())
}

/// Chinese prices: the currency symbol after the amount as a word (`¥1299.00` → `1299元`,
/// `$12.5万` → `12.5万美元`; a 元/块 already written after it is not doubled), for the grammar to
/// read the number.
pub(super) fn money_zh(text: &str) -> String {
    static R: OnceLock<Regex> = OnceLock::new();
    let text = regex(&R, r"([¥￥$€£])\s?([0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.([0-9]+))?(万|亿)?(?:元|块)?").replace_all(text, |c: &regex::Captures<'_>| {
        let unit = match &c[1] {
            "¥" | "￥" => "元",
            "$" => "美元",
            "€" => "欧元",
            _ => "英镑",
        };
        let decimals = trimmed_decimals(c.get(3));
        let point = if decimals.is_empty() { String::new() } else { format!(".{decimals}") };
        format!("{}{point}{}{unit}", amount(&c[2]), c.get(4).map_or("", |m| m.as_str()))
    });
    text.into_owned()
}

/// English prices in words: `$1299.50` → "one thousand two hundred and ninety nine dollars and
/// fifty cents", `$0.99` → "ninety nine cents", `€20` → "twenty euros"; a scale word after the
/// amount (`$2.5 million`) keeps the decimal: "two point five million dollars".
pub(super) fn money_en(text: &str) -> String {
    static R: OnceLock<Regex> = OnceLock::new();
    regex(&R, r"([$€£¥])\s?([0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.([0-9]+))?(?:\s?(thousand|million|billion|trillion)\b)?").replace_all(text, |c: &regex::Captures<'_>| {
        let (one, many, cent, cents) = match &c[1] {
            "$" => ("dollar", "dollars", "cent", "cents"),
            "€" => ("euro", "euros", "cent", "cents"),
            "£" => ("pound", "pounds", "penny", "pence"),
            _ => ("yen", "yen", "sen", "sen"),
        };
        let digits = amount(&c[2]);
        // Past u64 the amount is read digit by digit (and is plural), never as zero.
        let whole = digits.parse::<u64>().ok();
        if let Some(scale) = c.get(4) {
            let decimals = trimmed_decimals(c.get(3));
            let point = if decimals.is_empty() { String::new() } else { format!(" point {}", digits_words(&decimals)) };
            return format!("{}{point} {} {many}", cardinal_or_digits(&digits), scale.as_str());
        }
        let fraction = c.get(3).map_or(0, |m| {
            let mut s: String = m.as_str().chars().take(2).collect();
            while s.len() < 2 {
                s.push('0');
            }
            s.parse::<u64>().unwrap_or(0)
        });
        let whole_words = format!("{} {}", cardinal_or_digits(&digits), if whole == Some(1) { one } else { many });
        match (whole, fraction) {
            (_, 0) => whole_words,
            (Some(0), f) => format!("{} {}", number_words(f), if f == 1 { cent } else { cents }),
            (_, f) => format!("{whole_words} and {} {}", number_words(f), if f == 1 { cent } else { cents }),
        }
    })
    .into_owned()
}

/// English cardinals and decimals that wetext-rs's grammar reads differently from the reference's
/// (`100` → "one oh oh", `98.6` → "nine eight point six", `5-10` → "five minus ten"), spelled here
/// as the reference reads them, with a unit or percent sign right after them ([`UNITS`]) read too:
/// standalone numbers only (not in times, dates, versions, codes, phone numbers, sums, ordinals or
/// decades, not after a month's name, no leading zero), and two numbers of up to four digits
/// joined by a hyphen as a range. Four-digit numbers from 1000 to 2099 without a unit stay for the
/// grammar (it reads them as years, as the reference does). A whole part longer than
/// [`readings::EN_MAX_CARDINAL_DIGITS`] is read digit by digit ("Order 18446744073709551616" was
/// "Order zero"). A negative number is "minus", a temperature too ("minus five degrees Celsius";
/// the reference: "negative").
pub(super) fn english_numbers(text: &str) -> String {
    static RANGE: OnceLock<Regex> = OnceLock::new();
    static NUMBER: OnceLock<Regex> = OnceLock::new();
    let ranged = regex(&RANGE, r"(^|[\s(])([0-9]{1,4})-([0-9]{1,4})([\s,.;:!?)]|$)").replace_all(text, |c: &regex::Captures<'_>| {
        // Two years stay years ("1990 to 2000"); a four-digit end of another range is a number,
        // not a year ("100-1000": "one hundred to one thousand", not "… to ten hundred").
        let year = |s: &str| s.len() == 4 && (1000..=2099).contains(&s.parse::<u32>().unwrap_or(0));
        let years = year(&c[2]) && year(&c[3]);
        let end = |s: &str| if s.len() == 4 && !years && !s.starts_with('0') { number_words(s.parse().unwrap_or(0)) } else { s.to_string() };
        format!("{}{} to {}{}", &c[1], end(&c[2]), end(&c[3]), &c[4])
    });
    let number = regex(&NUMBER, r"[0-9]+(?:\.[0-9]+)?");
    let mut out = String::with_capacity(ranged.len());
    let mut last = 0;
    for m in number.find_iter(&ranged) {
        if m.start() < last {
            continue;
        }
        let digits = m.as_str();
        let head = &ranged[..m.start()];
        let rest = &ranged[m.end()..];
        let mut back = head.chars().rev();
        let before = back.next();
        let sign = before == Some('-') && back.next().is_none_or(char::is_whitespace);
        let unit = unit_after(rest);
        let mut ahead = rest.chars();
        let after = ahead.next();
        let digit_after = ahead.next().is_some_and(|c| c.is_ascii_digit());
        let suffix: String = rest.chars().take(2).collect::<String>().to_lowercase();
        let ordinal_or_decade = ["st", "nd", "rd", "th"].contains(&suffix.as_str()) || suffix.starts_with('s');
        let joined_before = !sign && before.is_some_and(|c| c.is_alphanumeric() || ":/-.,()+=×*<>#$€£¥".contains(c));
        let joined_after = unit.is_none()
            && (after.is_some_and(|c| c.is_alphanumeric() || ":/-()+=×*<>°%²³".contains(c)) || (matches!(after, Some('.' | ',')) && digit_after) || ordinal_or_decade);
        let after_month = head.split_whitespace().next_back().is_some_and(|w| MONTHS.contains(&w.trim_end_matches('.').to_lowercase().as_str()));
        let leading_zero = digits.len() > 1 && digits.starts_with('0') && !digits.contains('.');
        let year = unit.is_none() && digits.len() == 4 && (1000..=2099).contains(&digits.parse::<u32>().unwrap_or(0));
        out.push_str(&ranged[last..m.start()]);
        last = m.end();
        if joined_before || joined_after || after_month || leading_zero || year {
            out.push_str(digits);
            continue;
        }
        if sign {
            out.pop();
            out.push_str("minus ");
        }
        let (whole, decimals) = digits.split_once('.').unwrap_or((digits, ""));
        match whole.parse::<u64>() {
            Ok(n) if whole.len() <= readings::EN_MAX_CARDINAL_DIGITS => out.push_str(&number_words(n)),
            _ => out.push_str(&digit_words(whole, "oh")),
        }
        if !decimals.is_empty() {
            out.push_str(" point ");
            out.push_str(&digits_words(decimals));
        }
        if let Some((len, one, many)) = unit {
            out.push(' ');
            out.push_str(if digits == "1" { one } else { many });
            last += len;
        }
    }
    out.push_str(&ranged[last..]);
    out
}

const MONTHS: [&str; 24] = [
    "january", "february", "march", "april", "may", "june", "july", "august", "september", "october", "november", "december", "jan", "feb", "mar",
    "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
];

/// Units read after a number: (written, singular, plural). Longest first where one is a prefix.
const UNITS: [(&str, &str, &str); 27] = [
    ("%", "percent", "percent"),
    ("°C", "degree Celsius", "degrees Celsius"),
    ("°F", "degree Fahrenheit", "degrees Fahrenheit"),
    ("km/h", "kilometer per hour", "kilometers per hour"),
    ("mph", "mile per hour", "miles per hour"),
    ("km²", "square kilometer", "square kilometers"),
    ("m²", "square meter", "square meters"),
    ("m³", "cubic meter", "cubic meters"),
    ("km", "kilometer", "kilometers"),
    ("cm", "centimeter", "centimeters"),
    ("mm", "millimeter", "millimeters"),
    ("kg", "kilogram", "kilograms"),
    ("mg", "milligram", "milligrams"),
    ("ml", "milliliter", "milliliters"),
    ("lbs", "pound", "pounds"),
    ("lb", "pound", "pounds"),
    ("ft", "foot", "feet"),
    ("GB", "gigabyte", "gigabytes"),
    ("MB", "megabyte", "megabytes"),
    ("TB", "terabyte", "terabytes"),
    ("KB", "kilobyte", "kilobytes"),
    ("GHz", "gigahertz", "gigahertz"),
    ("MHz", "megahertz", "megahertz"),
    ("Hz", "hertz", "hertz"),
    ("kW", "kilowatt", "kilowatts"),
    ("m", "meter", "meters"),
    ("g", "gram", "grams"),
];

/// The unit at the start of `rest` (after at most one space), not followed by a letter: its byte
/// length (space included) and its words.
pub(super) fn unit_after(rest: &str) -> Option<(usize, &'static str, &'static str)> {
    let space = usize::from(rest.starts_with(' '));
    let r = &rest[space..];
    UNITS.iter().find_map(|&(written, one, many)| {
        let tail = r.strip_prefix(written)?;
        let letter_next = tail.chars().next().is_some_and(char::is_alphabetic);
        (!letter_next).then_some((space + written.len(), one, many))
    })
}

/// Decades: `1990s` → "nineteen nineties", `2000s` → "two thousands" (the grammar and the
/// reference read "one thousand nine hundred and ninety seconds").
pub(super) fn decades(text: &str) -> String {
    static R: OnceLock<Regex> = OnceLock::new();
    const TENS: [&str; 10] = ["hundreds", "tens", "twenties", "thirties", "forties", "fifties", "sixties", "seventies", "eighties", "nineties"];
    regex(&R, r"(?-u:\b)(1[0-9]|20)([0-9])0s(?-u:\b)").replace_all(text, |c: &regex::Captures<'_>| {
        let century: u64 = c[1].parse().unwrap_or(0);
        let decade = c[2].parse::<usize>().unwrap_or(0);
        match (century, decade) {
            (20, 0) => "two thousands".to_string(),
            _ => format!("{} {}", number_words(century), TENS[decade]),
        }
    })
    .into_owned()
}

/// Web addresses and e-mail addresses read as the reference reads them: `www.example.com` →
/// "WWW dot example dot com", `test@example.com` → "test at example dot com".
pub(super) fn web_addresses(text: &str) -> String {
    static EMAIL: OnceLock<Regex> = OnceLock::new();
    static WWW: OnceLock<Regex> = OnceLock::new();
    let dots = |s: &str| s.split('.').collect::<Vec<_>>().join(" dot ");
    let text = regex(&EMAIL, r"\b([A-Za-z0-9._%+-]+)@([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)\b")
        .replace_all(text, |c: &regex::Captures<'_>| format!("{} at {}", dots(&c[1]), dots(&c[2])));
    regex(&WWW, r"\bwww\.([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)\b")
        .replace_all(&text, |c: &regex::Captures<'_>| format!("WWW dot {}", dots(&c[1])))
        .into_owned()
}

/// Digits read one by one ("5" → "five", "25" → "two five"), as decimals are.
pub(super) fn digits_words(digits: &str) -> String {
    digit_words(digits, "zero")
}

/// The reference's `spell_out_number`: every run of ASCII digits left after the grammar, in words.
pub(super) fn spell_out_numbers(text: &str) -> String {
    static R: OnceLock<Regex> = OnceLock::new();
    regex(&R, r"[0-9]+").replace_all(text, |c: &regex::Captures<'_>| match c[0].parse::<u64>() {
        Ok(n) => crate::frontend::english::inflect_words(n),
        Err(_) => digits_words(&c[0]),
    })
    .into_owned()
}
