//! Human-readable byte counts.

/// Formats a byte count with binary units: `"512 B"`, `"96.0 MiB"`, `"1.20 GiB"`.
///
/// KiB and MiB get one decimal, GiB and larger two (a budget of "1.25 GiB" must not read "1.2").
pub fn format_bytes(bytes: u64) -> String {
    formatted(bytes, |v| v)
}

/// [`format_bytes`] rounded up at the printed precision: a figure that, given back as a size
/// (`--memory-budget 414.7MiB`), is at least `bytes`. For the least budgets that errors name.
pub fn format_bytes_at_least(bytes: u64) -> String {
    formatted(bytes, f64::ceil)
}

/// `bytes` in the largest binary unit under 1024 of it, with one decimal (KiB, MiB) or two
/// (GiB and up), `round` applied at that precision first (the identity: the formatter's own
/// rounding to nearest).
fn formatted(bytes: u64, round: fn(f64) -> f64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let name = UNITS[unit];
    if unit >= 2 {
        format!("{:.2} {name}", round(value * 100.0) / 100.0)
    } else {
        format!("{:.1} {name}", round(value * 10.0) / 10.0)
    }
}

#[cfg(test)]
mod tests {
    use super::{format_bytes, format_bytes_at_least};

    #[test]
    fn formats_units() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(96 << 20), "96.0 MiB");
        assert_eq!(format_bytes(1288490189), "1.20 GiB");
        assert_eq!(format_bytes(8 << 20), "8.0 MiB");
        assert_eq!(format_bytes(300 << 10), "300.0 KiB");
    }

    /// Rounded up, the printed figure is never below the count (the nearest can be).
    #[test]
    fn at_least_rounds_up() {
        let bytes = 434_800_000; // 414.658 MiB
        assert_eq!(format_bytes(bytes), "414.7 MiB");
        assert_eq!(format_bytes_at_least(bytes), "414.7 MiB");
        let bytes = 434_700_000; // 414.562 MiB
        assert_eq!(format_bytes(bytes), "414.6 MiB");
        assert_eq!(format_bytes_at_least(bytes), "414.6 MiB");
        let bytes = 434_690_000; // 414.553 MiB
        assert_eq!(format_bytes_at_least(bytes), "414.6 MiB");
        // 414.505 MiB: the nearest reads 414.5, below it.
        assert_eq!(format_bytes(434_640_000), "414.5 MiB");
        assert_eq!(format_bytes_at_least(434_640_000), "414.6 MiB");
        assert_eq!(format_bytes_at_least(2 << 30), "2.00 GiB");
        assert_eq!(format_bytes_at_least((2 << 30) + 1), "2.01 GiB");
        assert_eq!(format_bytes_at_least(96 << 20), "96.0 MiB");
    }
}
