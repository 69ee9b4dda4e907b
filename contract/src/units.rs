//! Human units: sizes (`8MiB`) and durations (`30d`, `12h`). The operator writes durations
//! into the spec and the agent's arguments, the agent parses them: one grammar for both. Pure.

use std::time::Duration;

/// `123`, `64KiB`, `8MiB`, `1GiB` (also `K`, `M`, `G`, `KB`, `MB`, `GB` as binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (e.g. 8MiB)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => return Err(format!("unknown size unit '{other}' in '{s}'")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size '{s}' is too large"))
}

/// `30d`, `12h`, `90m`, `45s`, `2w`, or combinations such as `1d12h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration (e.g. 30d, 12h)".into());
    }
    let mut total: u64 = 0;
    let mut num = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let n: u64 = num
            .parse()
            .map_err(|_| format!("'{s}' is not a duration (e.g. 30d, 12h)"))?;
        num.clear();
        let unit: u64 = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            'w' => 7 * 86_400,
            _ => {
                return Err(format!(
                    "unknown duration unit '{c}' in '{s}' (use s, m, h, d, w)"
                ));
            }
        };
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| format!("duration '{s}' is too large"))?;
    }
    if !num.is_empty() {
        return Err(format!("'{s}' lacks a unit (e.g. 30d, 12h)"));
    }
    Ok(Duration::from_secs(total))
}

/// A duration as people write it: `2d`, `26h`, `90m`, `45s` ([`parse_duration`] reads it back).
pub fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => "0s".into(),
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        let cases = [
            ("0", Ok(0)),
            ("5MiB", Ok(5 << 20)),
            ("8M", Ok(8 << 20)),
            ("64kib", Ok(64 << 10)),
            ("1GiB", Ok(1 << 30)),
            ("12 MB", Ok(12 << 20)),
            ("", Err(())),
            ("MiB", Err(())),
            ("5TiB", Err(())),
            ("-1", Err(())),
            ("99999999999999999999G", Err(())),
        ];
        for (input, want) in cases {
            assert_eq!(parse_size(input).map_err(|_| ()), want, "{input:?}");
        }
    }

    #[test]
    fn durations() {
        let cases = [
            ("30d", Ok(30 * 86_400)),
            ("12h", Ok(43_200)),
            ("1d12h", Ok(129_600)),
            ("90m", Ok(5_400)),
            ("2w", Ok(1_209_600)),
            ("45s", Ok(45)),
            ("", Err(())),
            ("30", Err(())),
            ("d", Err(())),
            ("3y", Err(())),
            ("-1d", Err(())),
            ("99999999999999999999d", Err(())),
        ];
        for (input, want) in cases {
            assert_eq!(
                parse_duration(input).map(|d| d.as_secs()).map_err(|_| ()),
                want,
                "{input:?}"
            );
        }
    }

    #[test]
    fn formatted_durations_parse_back() {
        for secs in [
            0,
            1,
            59,
            60,
            90,
            3600,
            5400,
            86_400,
            93_600,
            7 * 86_400,
            30 * 86_400,
        ] {
            let d = Duration::from_secs(secs);
            assert_eq!(parse_duration(&format_duration(d)), Ok(d), "{secs}");
        }
        assert_eq!(format_duration(Duration::from_secs(26 * 3600)), "26h");
    }
}
