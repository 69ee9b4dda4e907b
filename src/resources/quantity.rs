//! Kubernetes resource quantities (`10Gi`, `1.5G`, `500M`, `1e9`) as byte counts, to compare
//! requested and actual volume sizes and to size the server's memory settings. Pure.

/// The number of bytes a quantity stands for, rounded down; None when it is not a quantity.
pub fn bytes(text: &str) -> Option<u128> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let multiplier: f64 = match suffix {
        "" => 1.0,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        s if s.starts_with(['e', 'E']) => 10f64.powi(s[1..].parse::<i32>().ok()?),
        _ => return None,
    };
    let value: f64 = number.parse().ok()?;
    if !value.is_finite() || value < 0.0 {
        return None;
    }
    Some((value * multiplier).floor() as u128)
}

#[cfg(test)]
mod tests {
    use super::bytes;

    #[test]
    fn quantities() {
        let table = [
            ("1Gi", Some(1u128 << 30)),
            ("100Gi", Some(100u128 << 30)),
            ("1.5Gi", Some(3u128 << 29)),
            ("500M", Some(500_000_000)),
            ("1e9", Some(1_000_000_000)),
            ("2048", Some(2048)),
            ("1500m", Some(1)),
            ("abc", None),
            ("10Qi", None),
            ("", None),
            ("-1Gi", None),
        ];
        for (text, want) in table {
            assert_eq!(bytes(text), want, "{text}");
        }
        assert!(bytes("1Gi") > bytes("1G"));
    }
}
