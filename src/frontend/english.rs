//! English numbers in words, two spellings: [`inflect_words`] as Python's `inflect`
//! (`number_to_words`, which CosyVoice's `spell_out_number` uses: "one thousand, two hundred and
//! thirty-four") and [`number_words`] as the English grammar writes numbers ("one thousand two
//! hundred and thirty four"), for the amounts the normaliser spells itself, past `u64` up to the
//! decillions from their digits ([`cardinal_or_digits`]); and digits one by one ([`digit_words`])
//! for codes and numbers longer than that: a number never reads as "zero" for not fitting a `u64`.
//!
//! Neighbours: `normalize` and `readings` call them.

const ONES: [&str; 20] = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen",
    "sixteen", "seventeen", "eighteen", "nineteen",
];
const TENS: [&str; 10] = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"];
const SCALES: [&str; 12] =
    ["", "thousand", "million", "billion", "trillion", "quadrillion", "quintillion", "sextillion", "septillion", "octillion", "nonillion", "decillion"];

/// 1…999 in words; `hyphen` joins tens and ones ("twenty-one" or "twenty one"), `and` after the
/// hundreds ("one hundred and one" or "one hundred one").
fn below_thousand(n: u64, hyphen: &str, and: bool) -> String {
    let (hundreds, rest) = (n / 100, n % 100);
    let tens = match rest {
        0 => String::new(),
        1..=19 => ONES[rest as usize].to_string(),
        _ if rest % 10 == 0 => TENS[(rest / 10) as usize].to_string(),
        _ => format!("{}{hyphen}{}", TENS[(rest / 10) as usize], ONES[(rest % 10) as usize]),
    };
    match (hundreds, tens.is_empty()) {
        (0, _) => tens,
        (h, true) => format!("{} hundred", ONES[h as usize]),
        (h, false) if and => format!("{} hundred and {tens}", ONES[h as usize]),
        (h, false) => format!("{} hundred {tens}", ONES[h as usize]),
    }
}

/// Groups of three digits from the highest, joined by `comma`; a last group under a hundred after
/// higher ones is joined by "and" ("one thousand and five"); "and" after the hundreds of every
/// group, or (`and_in_units_only`) of the units group only.
fn words(n: u64, comma: &str, hyphen: &str, and_in_units_only: bool) -> String {
    let mut groups = Vec::new();
    let mut rest = n;
    while rest > 0 {
        groups.push(rest % 1000);
        rest /= 1000;
    }
    group_words(&groups, comma, hyphen, and_in_units_only)
}

/// [`words`] of a number given as its groups of three digits, the lowest first (at most
/// `SCALES.len()` of them).
fn group_words(groups: &[u64], comma: &str, hyphen: &str, and_in_units_only: bool) -> String {
    if groups.iter().all(|&g| g == 0) {
        return ONES[0].to_string();
    }
    let mut parts: Vec<String> = Vec::new();
    for (scale, &g) in groups.iter().enumerate().rev() {
        if g == 0 {
            continue;
        }
        let w = below_thousand(g, hyphen, scale == 0 || !and_in_units_only);
        parts.push(if scale == 0 { w } else { format!("{w} {}", SCALES[scale]) });
    }
    let last = groups[0];
    let mut out = String::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            let final_small = i == parts.len() - 1 && last > 0 && last < 100;
            out.push_str(if final_small { " and " } else { comma });
        }
        out.push_str(p);
    }
    out
}

/// As `inflect.engine().number_to_words(str(n))`.
pub fn inflect_words(n: u64) -> String {
    words(n, ", ", "-", false)
}

/// As the English grammar spells numbers: no commas, no hyphens, "and" in the units group only
/// ("one million two hundred thirty four thousand five hundred and sixty seven").
pub fn number_words(n: u64) -> String {
    words(n, " ", " ", true)
}

/// Digits one by one, `zero` for 0 ("oh" in phone numbers and codes, "zero" in decimals):
/// `digit_words("2050", "oh")` → "two oh five oh". Anything but ASCII digits is skipped.
pub fn digit_words(digits: &str, zero: &str) -> String {
    digits
        .chars()
        .filter_map(|c| c.to_digit(10))
        .map(|d| if d == 0 { zero } else { ONES[d as usize] })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A string of ASCII digits as a number in words, spelled as [`number_words`] spells it, up to
/// the decillions (36 digits, past `u64`: "one sextillion"); longer, one digit at a time ("oh" for
/// 0). Never "zero" for a number too large to parse.
pub fn cardinal_or_digits(digits: &str) -> String {
    let significant = digits.trim_start_matches('0').as_bytes();
    if !digits.bytes().all(|b| b.is_ascii_digit()) || significant.len() > 3 * SCALES.len() {
        return digit_words(digits, "oh");
    }
    let groups: Vec<u64> = significant
        .rchunks(3)
        .map(|g| g.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')))
        .collect();
    group_words(&groups, " ", " ", true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inflect_spelling_as_python_inflect() {
        // Outputs of inflect 7.6.0's number_to_words.
        for (n, w) in [
            (0, "zero"),
            (21, "twenty-one"),
            (101, "one hundred and one"),
            (1005, "one thousand and five"),
            (1100, "one thousand, one hundred"),
            (1234, "one thousand, two hundred and thirty-four"),
            (100001, "one hundred thousand and one"),
            (2000010, "two million and ten"),
            (1234567, "one million, two hundred and thirty-four thousand, five hundred and sixty-seven"),
            (123456789012, "one hundred and twenty-three billion, four hundred and fifty-six million, seven hundred and eighty-nine thousand and twelve"),
            (1_000_000_000_000_000_000, "one quintillion"),
        ] {
            assert_eq!(inflect_words(n), w, "{n}");
        }
        assert_eq!(number_words(1299), "one thousand two hundred and ninety nine");
        assert_eq!(number_words(1234567), "one million two hundred thirty four thousand five hundred and sixty seven");
    }

    #[test]
    fn numbers_past_u64_are_read_in_scales_then_digit_by_digit_never_as_zero() {
        assert_eq!(cardinal_or_digits("18446744073709551615"), number_words(u64::MAX));
        assert_eq!(cardinal_or_digits("1234"), number_words(1234));
        assert_eq!(cardinal_or_digits("18446744073709551616"), "eighteen quintillion four hundred forty six quadrillion seven hundred forty four trillion seventy three billion seven hundred nine million five hundred fifty one thousand six hundred and sixteen");
        assert_eq!(cardinal_or_digits("1000000000000000000000"), "one sextillion");
        assert_eq!(cardinal_or_digits(&format!("1{}", "0".repeat(36))), format!("one{}", " oh".repeat(36)), "past the decillions");
        assert_eq!((cardinal_or_digits("0"), cardinal_or_digits("000")), ("zero".into(), "zero".into()));
        assert_eq!(digit_words("2050", "zero"), "two zero five zero");
    }
}
