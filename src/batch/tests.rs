//! The batch policy's unit tests: plain values in, decisions out (no I/O).

use super::*;

fn job(seq: u64, tokens: usize, priority: u8, at: Instant) -> Pending<u64> {
    Pending { item: seq, tokens, priority, arrived: at, seq }
}

fn flush(d: Decision<u64>) -> Flush<u64> {
    match d {
        Decision::Flush(f) => f,
        Decision::Wait(w) => panic!("expected a flush, got wait {w:?}"),
    }
}

fn ids(f: &Flush<u64>) -> Vec<u64> {
    f.items.iter().map(|p| p.item).collect()
}

#[test]
fn a_partial_batch_waits_until_its_deadline() {
    let t0 = Instant::now();
    let mut b = LengthBucketing::new(4, Duration::from_millis(100), 10_000);
    b.push(job(0, 10, 0, t0));
    match b.decide(t0, false) {
        Decision::Wait(Some(at)) => assert_eq!(at, t0 + Duration::from_millis(100)),
        other => panic!("{other:?}"),
    }
    let f = flush(b.decide(t0 + Duration::from_millis(100), false));
    assert_eq!((ids(&f), f.reason), (vec![0], FlushReason::Deadline));
    assert!(b.is_empty());
    assert!(matches!(b.decide(t0, false), Decision::Wait(None)));
}

#[test]
fn a_full_batch_groups_the_oldest_job_with_its_nearest_lengths() {
    let t0 = Instant::now();
    let mut b = LengthBucketing::new(3, Duration::from_secs(10), 10_000);
    for (seq, tokens) in [(0, 50), (1, 5), (2, 48), (3, 500), (4, 52), (5, 6)] {
        b.push(job(seq, tokens, 0, t0));
    }
    let f = flush(b.decide(t0, false));
    assert_eq!(f.reason, FlushReason::Full);
    assert_eq!(ids(&f), vec![2, 0, 4], "sorted by length, around the oldest job");
    assert!((f.padding().2 - (1.0 - 150.0 / 156.0)).abs() < 1e-9);
    let f = flush(b.decide(t0, false));
    assert_eq!((ids(&f), f.reason), (vec![1, 5], FlushReason::Bucket), "500 tokens is no bucket-mate of 5");
    assert_eq!(b.len(), 1);
}

#[test]
fn higher_priority_jobs_are_served_first() {
    let t0 = Instant::now();
    let mut b = LengthBucketing::new(2, Duration::from_secs(10), 10_000);
    b.push(job(0, 10, 0, t0));
    b.push(job(1, 10, 0, t0));
    b.push(job(2, 90, 9, t0));
    b.push(job(3, 80, 9, t0));
    let f = flush(b.decide(t0, false));
    assert_eq!(ids(&f), vec![3, 2]);
    let f = flush(b.decide(t0, true));
    assert_eq!((ids(&f), f.reason), (vec![0, 1], FlushReason::Full));
}

#[test]
fn padded_tokens_never_exceed_the_budget_but_one_long_job_still_runs() {
    let t0 = Instant::now();
    let mut b = LengthBucketing::new(8, Duration::from_secs(10), 100);
    b.push(job(0, 40, 0, t0));
    b.push(job(1, 30, 0, t0));
    b.push(job(2, 45, 0, t0));
    // 3 × 45 > 100: the budget closes a batch of two at once, without waiting for the deadline.
    let f = flush(b.decide(t0, false));
    assert_eq!(f.reason, FlushReason::Tokens);
    assert!(f.padding().1 <= 100);
    assert_eq!(ids(&f), vec![0, 2]);
    b.push(job(3, 1000, 0, t0));
    let f = flush(b.decide(t0, true));
    assert_eq!(ids(&f), vec![1], "the oldest first");
    let f = flush(b.decide(t0, true));
    assert_eq!((ids(&f), f.reason), (vec![3], FlushReason::Drain), "over budget alone: runs alone");
}

#[test]
fn a_work_budget_counts_the_jobs_tokens_added_up_not_their_padding() {
    let t0 = Instant::now();
    // A chapter (30,000 tokens) and fifty lines of 100: 35,000 tokens of work, 1.53 million
    // padded. A padded cap of 40,000 runs the chapter alone; the work budget takes them all.
    let mut padded = LengthBucketing::new(64, Duration::from_secs(10), 40_000).with_max_length_ratio(f64::INFINITY);
    let mut work = LengthBucketing::with_admission(64, Duration::from_secs(10), WorkBudget { max_tokens: 40_000 })
        .with_max_length_ratio(f64::INFINITY);
    for b in [&mut padded as &mut dyn BatchPolicy<u64>, &mut work] {
        b.push(job(0, 30_000, 0, t0));
        for seq in 1..=50 {
            b.push(job(seq, 100, 0, t0));
        }
    }
    let f = flush(padded.decide(t0, true));
    assert_eq!((ids(&f), f.reason), (vec![0], FlushReason::Tokens));
    let f = flush(work.decide(t0, true));
    assert_eq!(f.items.len(), 51, "{:?}", f.reason);
    // Past the budget the jobs farthest in length from the oldest go first: here the chapter.
    let mut tight = LengthBucketing::with_admission(64, Duration::from_secs(10), WorkBudget { max_tokens: 20_000 })
        .with_max_length_ratio(f64::INFINITY);
    for seq in 1..=50 {
        tight.push(job(seq, 100, 0, t0));
    }
    tight.push(job(51, 30_000, 0, t0 + Duration::from_millis(1)));
    let f = flush(tight.decide(t0, false));
    assert_eq!((f.items.len(), f.reason), (50, FlushReason::Tokens), "the fifty lines now, the chapter next");
    assert_eq!(ids(&flush(tight.decide(t0, true))), vec![51]);
}

#[test]
fn a_work_budget_takes_a_small_remainder_rather_than_leave_it_for_a_batch_of_its_own() {
    let t0 = Instant::now();
    let budget = || {
        LengthBucketing::with_admission(64, Duration::from_secs(10), WorkBudget { max_tokens: 40_000 })
            .with_max_length_ratio(f64::INFINITY)
    };
    // Nine lines of 4,000 and a chapter of 8,000: 44,000, over the budget by a chapter that
    // is under a quarter of it — one batch, not a batch of nine and the chapter alone.
    let mut b = budget();
    for seq in 0..9 {
        b.push(job(seq, 4_000, 0, t0));
    }
    b.push(job(9, 8_000, 0, t0));
    let f = flush(b.decide(t0, false));
    assert_eq!((f.items.len(), f.reason), (10, FlushReason::Tokens), "a full batch runs at once");
    assert!(b.is_empty());
    // A chapter of 12,000 (over a quarter) stays behind for the next batch.
    let mut b = budget();
    for seq in 0..9 {
        b.push(job(seq, 4_000, 0, t0));
    }
    b.push(job(9, 12_000, 0, t0));
    let f = flush(b.decide(t0, false));
    assert_eq!((f.items.len(), f.reason), (9, FlushReason::Tokens));
    assert_eq!(ids(&flush(b.decide(t0, true))), vec![9]);
    // A hard rule (padded tokens) never goes over.
    let mut hard = LengthBucketing::new(64, Duration::from_secs(10), 40_000).with_max_length_ratio(f64::INFINITY);
    for seq in 0..9 {
        hard.push(job(seq, 400, 0, t0));
    }
    hard.push(job(9, 4_100, 0, t0));
    let f = flush(hard.decide(t0, true));
    assert_eq!((f.items.len(), f.reason), (9, FlushReason::Tokens));
}

#[test]
fn a_batch_never_mixes_lengths_beyond_the_ratio() {
    let t0 = Instant::now();
    let mut b = LengthBucketing::new(8, Duration::from_secs(10), 1_000_000).with_max_length_ratio(1.5);
    for (seq, tokens) in [(0, 100), (1, 10), (2, 140), (3, 160), (4, 90), (5, 400), (6, 12), (7, 70)] {
        b.push(job(seq, tokens, 0, t0));
    }
    let f = flush(b.decide(t0, false));
    assert_eq!(ids(&f), vec![4, 0, 2], "lengths 90..140 around the oldest (100); 160 and 70 break the 1.5 ratio");
    assert_eq!(f.reason, FlushReason::Bucket);
    let f = flush(b.decide(t0, true));
    assert_eq!(ids(&f), vec![1, 6], "short jobs batch together (slack)");
}

#[test]
fn closing_flushes_everything_and_take_all_returns_the_rest() {
    let t0 = Instant::now();
    let mut b = LengthBucketing::new(4, Duration::from_secs(10), 10_000);
    b.push(job(0, 1, 0, t0));
    let f = flush(b.decide(t0, true));
    assert_eq!(f.reason, FlushReason::Drain);
    b.push(job(1, 1, 0, t0));
    b.push(job(2, 1, 0, t0));
    let rest = b.take_all();
    assert_eq!(rest.len(), 2);
    assert!(b.is_empty());
}
