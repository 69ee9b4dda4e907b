//! The plugin's text helpers both screens use: byte sizes in binary units and padded tables.
//!
//! Pure.

/// A byte count in binary units (`4.1 KiB`).
pub fn size(bytes: Option<i64>) -> String {
    let Some(bytes) = bytes else {
        return "-".into();
    };
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", units[unit])
    }
}

/// Rows padded into columns three spaces apart, each line indented by two spaces; the last
/// column is not padded.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let padded: Vec<String> = cells
            .into_iter()
            .enumerate()
            .map(|(i, cell)| match i == last {
                true => cell.to_string(),
                false => format!("{cell:<w$}", w = widths[i]),
            })
            .collect();
        format!("  {}", padded.join("   ")).trim_end().to_string() + "\n"
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out += &line(row.iter().map(String::as_str).collect());
    }
    out
}
