//! Charts: minimal SVG line and bar charts (no plotting dependency) and [`png`] to rasterise them.
//!
//! Neighbours: `report --plot` draws bars of a report; `bench` draws its sweeps.

use std::fmt::Write as _;

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    /// (x, y) points; x is plotted on a log2 axis.
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed and horizontal across the chart when it has one point and this is set.
    pub horizontal: bool,
}

/// A chart panel.
#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

const COLORS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];

/// Renders panels side by side, sharing the log2 x axis named `x_label`.
pub fn svg(panels: &[Panel], x_label: &str) -> String {
    let (pw, ph, m) = (460.0, 320.0, 56.0);
    let width = pw * panels.len() as f64;
    let mut out = String::new();
    let _ = writeln!(out, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{ph}" font-family="sans-serif" font-size="11">"#);
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (i, panel) in panels.iter().enumerate() {
        let ox = pw * i as f64;
        let all: Vec<(f64, f64)> = panel.series.iter().flat_map(|s| s.points.iter().copied()).collect();
        if all.is_empty() {
            continue;
        }
        let xs: Vec<f64> = all.iter().filter(|p| p.0 > 0.0).map(|p| p.0.log2()).collect();
        let (x0, x1) = (xs.iter().copied().fold(f64::MAX, f64::min).min(0.0), xs.iter().copied().fold(f64::MIN, f64::max).max(1.0));
        let y1 = all.iter().map(|p| p.1).fold(0.0, f64::max) * 1.1;
        let y1 = if y1 > 0.0 { y1 } else { 1.0 };
        let px = |x: f64| ox + m + (x.max(1e-9).log2() - x0) / (x1 - x0) * (pw - 1.5 * m);
        let py = |y: f64| ph - m + 10.0 - y / y1 * (ph - 1.6 * m);
        let _ = writeln!(out, r#"<text x="{}" y="18" font-size="13" font-weight="bold">{}</text>"#, ox + m, esc(&panel.title));
        let _ = writeln!(out, r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#, ox + m, py(0.0), ox + pw - m / 2.0, py(0.0));
        let _ = writeln!(out, r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#, ox + m, py(0.0), ox + m, py(y1));
        for k in (x0 as i64)..=(x1 as i64) {
            let x = 2f64.powi(k as i32);
            let _ = writeln!(out, r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#, px(x), py(0.0) + 14.0, x);
        }
        for k in 0..=4 {
            let y = y1 * k as f64 / 4.0;
            let _ = writeln!(out, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#, ox + m - 4.0, py(y) + 4.0, fmt_num(y));
            let _ = writeln!(out, r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#eee"/>"##, ox + m, py(y), ox + pw - m / 2.0, py(y));
        }
        let _ = writeln!(out, r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#, ox + pw / 2.0, ph - 8.0, esc(x_label));
        let _ = writeln!(out, r#"<text x="12" y="{:.1}" transform="rotate(-90 12 {:.1})" text-anchor="middle">{}</text>"#, ph / 2.0, ph / 2.0, esc(&panel.y_label));
        for (j, s) in panel.series.iter().enumerate() {
            let color = COLORS[j % COLORS.len()];
            if s.horizontal && s.points.len() == 1 {
                let y = py(s.points[0].1);
                let _ = writeln!(out, r#"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{color}" stroke-dasharray="6 4" stroke-width="2"/>"#, ox + m, ox + pw - m / 2.0);
            } else {
                let pts: Vec<String> = s.points.iter().map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y))).collect();
                let _ = writeln!(out, r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#, pts.join(" "));
                for (x, y) in &s.points {
                    let _ = writeln!(out, r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#, px(*x), py(*y));
                }
            }
            let _ = writeln!(out, r#"<text x="{:.1}" y="{:.1}" fill="{color}">{}</text>"#, ox + m + 8.0, 34.0 + 13.0 * j as f64, esc(&s.name));
        }
    }
    out.push_str("</svg>\n");
    out
}

/// One panel of a bar chart: its title, the unit its values are in (the y axis's name), values.
#[derive(Debug, Clone)]
pub struct BarPanel {
    pub title: String,
    pub unit: String,
    pub values: Vec<f64>,
}

/// Side-by-side bar charts sharing category `labels` (the x axis, named `x_label`): each panel
/// with its title, y-axis name, values on the bars; `caption` (what the data covers) under all.
pub fn bars(panels: &[BarPanel], labels: &[String], x_label: &str, caption: &str) -> String {
    let (pw, ph, m) = (460.0, 340.0, 56.0);
    let width = pw * panels.len().max(1) as f64;
    let plot_bottom = ph - m - 20.0;
    let mut out = String::new();
    let _ = writeln!(out, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{ph}" font-family="sans-serif" font-size="11">"#);
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (i, panel) in panels.iter().enumerate() {
        let ox = pw * i as f64;
        let top = panel.values.iter().copied().fold(0.0, f64::max) * 1.1;
        let top = if top > 0.0 { top } else { 1.0 };
        let n = panel.values.len().max(1) as f64;
        let slot = (pw - 1.5 * m) / n;
        let py = |y: f64| plot_bottom - y / top * (plot_bottom - 1.2 * m);
        let _ = writeln!(out, r#"<text x="{}" y="18" font-size="13" font-weight="bold">{}</text>"#, ox + m, esc(&panel.title));
        let (yx, yy) = (ox + 16.0, (plot_bottom + 1.2 * m) / 2.0);
        let _ = writeln!(out, r#"<text x="{yx}" y="{yy:.1}" text-anchor="middle" transform="rotate(-90 {yx} {yy:.1})">{}</text>"#, esc(&panel.unit));
        let _ = writeln!(out, r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#, ox + m, py(0.0), ox + pw - m / 2.0, py(0.0));
        let _ = writeln!(out, r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#, ox + m, py(0.0), ox + m, py(top));
        for (j, v) in panel.values.iter().enumerate() {
            let x = ox + m + slot * j as f64 + slot * 0.15;
            let _ = writeln!(out, r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"/>"#, py(*v), slot * 0.7, py(0.0) - py(*v), COLORS[i % COLORS.len()]);
            let _ = writeln!(out, r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#, x + slot * 0.35, py(*v) - 4.0, fmt_num(*v));
            let label = labels.get(j).map(String::as_str).unwrap_or("");
            let _ = writeln!(out, r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#, x + slot * 0.35, py(0.0) + 14.0, esc(label));
        }
        let _ = writeln!(out, r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#, ox + m + (pw - 1.5 * m) / 2.0, py(0.0) + 32.0, esc(x_label));
    }
    let _ = writeln!(out, r#"<text x="{}" y="{}" fill="dimgray">{}</text>"#, m, ph - 10.0, esc(caption));
    out.push_str("</svg>\n");
    out
}

/// Rasterises one of this module's SVG charts to PNG bytes at `scale` (1.0 = the SVG's pixels).
/// Text is set in DejaVu Sans, embedded in the binary (the `dejavu` crate; Bitstream Vera
/// licence): the same picture on a server without system fonts as on a desktop, and no font
/// look-ups to warn about.
pub fn png(svg: &str, scale: f32) -> Result<Vec<u8>, PlotError> {
    use resvg::{tiny_skia, usvg};
    let mut opt = usvg::Options::default();
    let fonts = opt.fontdb_mut();
    fonts.load_font_data(dejavu::sans::regular().to_vec());
    fonts.load_font_data(dejavu::sans::bold().to_vec());
    fonts.set_sans_serif_family("DejaVu Sans");
    let tree = usvg::Tree::from_str(svg, &opt).map_err(|e| PlotError::Svg(e.to_string()))?;
    let size = tree.size();
    let (w, h) = ((size.width() * scale).ceil() as u32, (size.height() * scale).ceil() as u32);
    let mut pixmap = tiny_skia::Pixmap::new(w.max(1), h.max(1)).ok_or(PlotError::Size { w, h })?;
    resvg::render(&tree, tiny_skia::Transform::from_scale(scale, scale), &mut pixmap.as_mut());
    pixmap.encode_png().map_err(|e| PlotError::Png(e.to_string()))
}

/// Errors rendering a chart to PNG.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlotError {
    #[error("invalid SVG: {0}")]
    Svg(String),
    #[error("cannot make a {w}x{h} image")]
    Size { w: u32, h: u32 },
    #[error("PNG encoding failed: {0}")]
    Png(String),
}

fn fmt_num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pixels that differ between two PNGs of the same size.
    fn differing_pixels(a: &[u8], b: &[u8]) -> usize {
        let (a, b) = (resvg::tiny_skia::Pixmap::decode_png(a).unwrap(), resvg::tiny_skia::Pixmap::decode_png(b).unwrap());
        assert_eq!((a.width(), a.height()), (b.width(), b.height()));
        a.pixels().iter().zip(b.pixels()).filter(|(x, y)| x != y).count()
    }

    #[test]
    fn png_charts_carry_their_text_without_system_fonts() {
        let panel = BarPanel { title: "Audio".into(), unit: "audio hours".into(), values: vec![3.0, 1.5] };
        let svg = bars(&[panel], &["book-1".into(), "book-2".into()], "campaign", "all campaigns; batches 2026-12-01 to 2026-12-04");
        let with_text = png(&svg, 1.0).unwrap();
        // The same chart with every text element removed: what a font-less renderer drew before.
        let without: String = svg.lines().filter(|l| !l.trim_start().starts_with("<text")).collect::<Vec<_>>().join("\n");
        let blank = png(&without, 1.0).unwrap();
        let text_pixels = differing_pixels(&with_text, &blank);
        assert!(text_pixels > 500, "title, values and labels are drawn: {text_pixels} pixels of text");
    }

    #[test]
    fn svg_has_one_polyline_per_series_and_escapes_text() {
        let p = Panel {
            title: "a < b".into(),
            y_label: "y".into(),
            series: vec![
                Series { name: "fixed".into(), points: vec![(1.0, 1.0), (2.0, 3.0), (4.0, 4.0)], horizontal: false },
                Series { name: "policy".into(), points: vec![(1.0, 5.0)], horizontal: true },
            ],
        };
        let s = svg(&[p.clone(), p], "batch size");
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<polyline").count(), 2);
        assert_eq!(s.matches("stroke-dasharray").count(), 2);
        assert!(s.contains("a &lt; b"));
        let png = png(&s, 1.0).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        // 920 x 320 pixels: width and height in the IHDR chunk.
        assert_eq!((u32::from_be_bytes(png[16..20].try_into().unwrap()), u32::from_be_bytes(png[20..24].try_into().unwrap())), (920, 320));
    }
}
