//! A few interchangeable copies of something that serves one caller at a time (a language's
//! normalisation grammar: `normalize`), so that callers on several threads run in parallel. A
//! caller takes a free copy, or waits for one (round robin) when all are busy.
//!
//! Neighbours: `normalize` keeps one pool per language; the worker sizes it to its frontend
//! threads (`[frontend] threads`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// A pool's copy was poisoned: a caller panicked while holding it.
#[derive(Debug, thiserror::Error)]
#[error("a previous caller panicked while holding this copy")]
pub struct Poisoned;

pub struct Pool<T> {
    copies: Vec<Mutex<T>>,
    next: AtomicUsize,
}

impl<T> Pool<T> {
    /// A pool of `copies` (at least one: an empty pool serves nobody).
    pub fn new(copies: Vec<T>) -> Pool<T> {
        assert!(!copies.is_empty(), "a pool needs a copy");
        Pool { copies: copies.into_iter().map(Mutex::new).collect(), next: AtomicUsize::new(0) }
    }

    /// A free copy, else the next busy one in turn once it is free. Blocking: call it off the
    /// async runtime.
    pub fn get(&self) -> Result<MutexGuard<'_, T>, Poisoned> {
        // A busy copy is passed over, and so is a poisoned one while another can serve.
        if let Some(guard) = self.copies.iter().find_map(|copy| copy.try_lock().ok()) {
            return Ok(guard);
        }
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % self.copies.len();
        self.copies[turn].lock().map_err(|_| Poisoned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_caller_takes_a_free_copy_and_waits_only_when_every_copy_is_busy() {
        let pool = Arc::new(Pool::new(vec![0usize, 1]));
        let first = pool.get().unwrap();
        // The other copy is free: a second caller gets it at once (with one lock it would wait).
        let (tx, rx) = mpsc::channel();
        let p = pool.clone();
        let second = std::thread::spawn(move || {
            let g = p.get().unwrap();
            tx.send(*g).unwrap();
            std::thread::sleep(Duration::from_millis(300));
        });
        let got = rx.recv_timeout(Duration::from_secs(2)).expect("a free copy is handed out without waiting");
        assert_ne!(got, *first, "the copy in use is not handed out twice");
        // Both busy now (the thread holds its copy for a while): a third caller waits.
        let (tx3, rx3) = mpsc::channel();
        let p = pool.clone();
        let third = std::thread::spawn(move || {
            let g = p.get().unwrap();
            tx3.send(*g).unwrap();
        });
        assert!(rx3.recv_timeout(Duration::from_millis(100)).is_err(), "every copy is busy: the caller waits");
        drop(first);
        second.join().unwrap();
        rx3.recv_timeout(Duration::from_secs(2)).expect("served once a copy is free");
        third.join().unwrap();
    }

    #[test]
    fn a_poisoned_copy_is_passed_over_while_another_is_free() {
        let pool = Arc::new(Pool::new(vec![0usize, 1]));
        let p = pool.clone();
        let _ = std::thread::spawn(move || {
            let _g = p.get().unwrap();
            panic!("a caller panics while holding copy 0");
        })
        .join();
        assert_eq!(*pool.get().unwrap(), 1, "the healthy copy serves");
    }
}
