//! One job's waveform as the model hands it over: its pieces in order (a text job's segments; one
//! piece otherwise), joined only where the job is encoded — on the commit stage's encoder threads,
//! not on the inference thread. Joined there, a text batch's segments kept the GPU waiting: the
//! 506-job batch of the 2026-12-04 corpus run's (26,753 s of audio, 2.6 GB of samples) spent 1.4 s
//! between its last token2wav bucket and its end with NVML at 12–15 %.
//!
//! Neighbours: `model` makes them (`model::ItemAudio`); `worker::commit` passes them to
//! [`super::encode_batch`], which joins each on the thread that encodes it.

use std::borrow::Cow;

/// Mono f32 samples as pieces in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Waveform {
    pieces: Vec<Vec<f32>>,
}

impl Waveform {
    /// The pieces in the order they are heard.
    pub fn from_pieces(pieces: Vec<Vec<f32>>) -> Waveform {
        Waveform { pieces }
    }

    /// Samples over all pieces.
    pub fn len(&self) -> usize {
        self.pieces.iter().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.pieces.iter().all(Vec::is_empty)
    }

    /// The pieces, in order.
    pub fn pieces(&self) -> &[Vec<f32>] {
        &self.pieces
    }

    /// The samples in one slice: borrowed when there is one piece, else joined (a copy).
    pub fn joined(&self) -> Cow<'_, [f32]> {
        match self.pieces.as_slice() {
            [] => Cow::Borrowed(&[]),
            [one] => Cow::Borrowed(one),
            many => Cow::Owned(many.concat()),
        }
    }

    /// The samples, joined (moved when there is one piece).
    pub fn into_samples(mut self) -> Vec<f32> {
        if self.pieces.len() == 1 {
            return self.pieces.pop().unwrap_or_default();
        }
        self.pieces.concat()
    }
}

impl From<Vec<f32>> for Waveform {
    fn from(samples: Vec<f32>) -> Waveform {
        Waveform { pieces: vec![samples] }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_join_in_order_and_one_piece_is_not_copied() {
        let w = Waveform::from_pieces(vec![vec![1.0, 2.0], vec![], vec![3.0]]);
        assert_eq!((w.len(), w.is_empty()), (3, false));
        assert_eq!(&*w.joined(), &[1.0, 2.0, 3.0]);
        assert_eq!(w.into_samples(), vec![1.0, 2.0, 3.0]);
        let one = Waveform::from(vec![0.5f32; 4]);
        assert!(matches!(one.joined(), Cow::Borrowed(_)));
        assert_eq!(one.into_samples(), vec![0.5; 4]);
        assert!(Waveform::default().is_empty() && Waveform::from_pieces(vec![vec![]]).is_empty());
        assert!(Waveform::default().joined().is_empty());
    }
}
