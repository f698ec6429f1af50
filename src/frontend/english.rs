//! English numbers in words, two spellings: [`inflect_words`] as Python's `inflect`
//! (`number_to_words`, which CosyVoice's `spell_out_number` uses: "one thousand, two hundred and
//! thirty-four") and [`number_words`] as the English grammar writes numbers ("one thousand two
//! hundred and thirty four"), for the amounts the normaliser spells itself.
//!
//! Neighbours: `normalize` calls both.

const ONES: [&str; 20] = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen",
    "sixteen", "seventeen", "eighteen", "nineteen",
];
const TENS: [&str; 10] = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"];
const SCALES: [&str; 7] = ["", "thousand", "million", "billion", "trillion", "quadrillion", "quintillion"];

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
    if n == 0 {
        return ONES[0].to_string();
    }
    let mut groups = Vec::new();
    let mut rest = n;
    while rest > 0 {
        groups.push(rest % 1000);
        rest /= 1000;
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
}
