//! Audio quality against a reference waveform: signal-to-noise ratio and log-spectral distance.
//! Used to measure what a precision costs in quality instead of assuming it.

/// SNR of `x` against `reference`, in dB: 10·log10(Σ ref² / Σ (ref − x)²). Infinite when equal.
pub fn snr_db(reference: &[f32], x: &[f32]) -> f64 {
    let n = reference.len().min(x.len());
    let (mut sig, mut noise) = (0.0f64, 0.0f64);
    for i in 0..n {
        let r = f64::from(reference[i]);
        sig += r * r;
        let d = r - f64::from(x[i]);
        noise += d * d;
    }
    if noise == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (sig.max(1e-30) / noise).log10()
    }
}

/// In-place radix-2 FFT of (re, im); `re.len()` must be a power of two.
fn fft(re: &mut [f64], im: &mut [f64]) {
    let n = re.len();
    let mut j = 0;
    for i in 1..n {
        let mut bit = n >> 1;
        while j & bit != 0 {
            j ^= bit;
            bit >>= 1;
        }
        j |= bit;
        if i < j {
            re.swap(i, j);
            im.swap(i, j);
        }
    }
    let mut len = 2;
    while len <= n {
        let ang = -2.0 * std::f64::consts::PI / len as f64;
        for start in (0..n).step_by(len) {
            for k in 0..len / 2 {
                let (wr, wi) = ((ang * k as f64).cos(), (ang * k as f64).sin());
                let (a, b) = (start + k, start + k + len / 2);
                let (xr, xi) = (re[b] * wr - im[b] * wi, re[b] * wi + im[b] * wr);
                re[b] = re[a] - xr;
                im[b] = im[a] - xi;
                re[a] += xr;
                im[a] += xi;
            }
        }
        len <<= 1;
    }
}

/// Power spectra of Hann-windowed frames (`n_fft` a power of two, hop `n_fft / 4`).
fn power_frames(x: &[f32], n_fft: usize) -> Vec<Vec<f64>> {
    let hop = n_fft / 4;
    let window: Vec<f64> = (0..n_fft).map(|i| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / n_fft as f64).cos()).collect();
    let mut frames = Vec::new();
    let mut start = 0;
    while start + n_fft <= x.len() {
        let mut re: Vec<f64> = (0..n_fft).map(|i| f64::from(x[start + i]) * window[i]).collect();
        let mut im = vec![0.0; n_fft];
        fft(&mut re, &mut im);
        frames.push((0..=n_fft / 2).map(|k| re[k] * re[k] + im[k] * im[k]).collect());
        start += hop;
    }
    frames
}

/// Log-spectral distance in dB: mean over frames of the RMS over bins of
/// 10·log10(P_ref + ε) − 10·log10(P_x + ε). 0 when equal.
pub fn log_spectral_distance(reference: &[f32], x: &[f32], n_fft: usize) -> f64 {
    let n = reference.len().min(x.len());
    let (a, b) = (power_frames(&reference[..n], n_fft), power_frames(&x[..n], n_fft));
    if a.is_empty() {
        return 0.0;
    }
    const EPS: f64 = 1e-10;
    let total: f64 = a
        .iter()
        .zip(&b)
        .map(|(fa, fb)| {
            let m: f64 = fa.iter().zip(fb).map(|(p, q)| (10.0 * (p + EPS).log10() - 10.0 * (q + EPS).log10()).powi(2)).sum::<f64>() / fa.len() as f64;
            m.sqrt()
        })
        .sum();
    total / a.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_signals_are_perfect_and_noise_lowers_snr() {
        let s: Vec<f32> = (0..4096).map(|i| (i as f32 * 0.05).sin() * 0.5).collect();
        assert!(snr_db(&s, &s).is_infinite());
        assert_eq!(log_spectral_distance(&s, &s, 512), 0.0);
        let noisy: Vec<f32> = s.iter().enumerate().map(|(i, v)| v + if i % 2 == 0 { 0.005 } else { -0.005 }).collect();
        let snr = snr_db(&s, &noisy);
        // signal power 0.125, noise power 2.5e-5 → 36.99 dB
        assert!((snr - 36.99).abs() < 0.05, "{snr}");
        let lsd = log_spectral_distance(&s, &noisy, 512);
        assert!(lsd > 0.0 && lsd.is_finite());
        let worse: Vec<f32> = s.iter().enumerate().map(|(i, v)| v + if i % 2 == 0 { 0.05 } else { -0.05 }).collect();
        assert!(snr_db(&s, &worse) < snr && log_spectral_distance(&s, &worse, 512) > lsd);
    }

    #[test]
    fn fft_of_a_cosine_is_two_spikes() {
        let n = 64;
        let mut re: Vec<f64> = (0..n).map(|i| (2.0 * std::f64::consts::PI * 4.0 * i as f64 / n as f64).cos()).collect();
        let mut im = vec![0.0; n];
        fft(&mut re, &mut im);
        let mag: Vec<f64> = re.iter().zip(&im).map(|(r, i)| (r * r + i * i).sqrt()).collect();
        assert!((mag[4] - 32.0).abs() < 1e-9 && (mag[60] - 32.0).abs() < 1e-9);
        assert!(mag.iter().enumerate().filter(|(k, _)| *k != 4 && *k != 60).all(|(_, m)| *m < 1e-9));
    }
}
