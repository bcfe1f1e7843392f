//! Human-readable byte counts.

/// Formats a byte count with binary units: `"512 B"`, `"96.0 MiB"`, `"1.20 GiB"`.
///
/// KiB and MiB get one decimal, GiB and larger two (a budget of "1.25 GiB" must not read "1.2").
pub fn format_bytes(bytes: u64) -> String {
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
        format!("{value:.2} {name}")
    } else {
        format!("{value:.1} {name}")
    }
}

#[cfg(test)]
mod tests {
    use super::format_bytes;

    #[test]
    fn formats_units() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(96 << 20), "96.0 MiB");
        assert_eq!(format_bytes(1288490189), "1.20 GiB");
        assert_eq!(format_bytes(8 << 20), "8.0 MiB");
        assert_eq!(format_bytes(300 << 10), "300.0 KiB");
    }
}
