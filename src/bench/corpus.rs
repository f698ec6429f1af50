//! A mixed-length synthetic corpus with a fixed seed: short prompts to paragraph-long texts.

use rand::{Rng, SeedableRng};

const WORDS: &[&str] = &[
    "the", "river", "quiet", "lamp", "harbour", "morning", "letter", "station", "green", "seven", "library", "window",
    "slowly", "bright", "across", "garden", "winter", "market", "number", "orange", "people", "silver", "travel", "voice",
    "chapter", "evening", "mountain", "ocean", "paper", "record", "summer", "yellow", "城市", "河流", "早上", "图书馆",
];

/// `n` texts: 40 % short (5–60 characters), 40 % medium (60–400), 20 % long (400–2000).
pub fn mixed_lengths(n: usize, seed: u64) -> Vec<String> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let r: f64 = rng.gen();
            let target = if r < 0.4 {
                rng.gen_range(5..60)
            } else if r < 0.8 {
                rng.gen_range(60..400)
            } else {
                rng.gen_range(400..2000)
            };
            let mut s = String::new();
            while s.chars().count() < target {
                if !s.is_empty() {
                    s.push(' ');
                }
                s.push_str(WORDS[rng.gen_range(0..WORDS.len())]);
            }
            s.chars().take(target).collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_corpus_is_deterministic_and_mixed() {
        let a = super::mixed_lengths(200, 7);
        assert_eq!(a, super::mixed_lengths(200, 7));
        let lens: Vec<usize> = a.iter().map(|s| s.chars().count()).collect();
        assert!(lens.iter().any(|&l| l < 60) && lens.iter().any(|&l| l >= 400));
        assert!(lens.iter().all(|&l| (5..2000).contains(&l)));
    }
}
