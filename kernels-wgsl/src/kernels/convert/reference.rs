//! CPU reference for [`convert`](super): `f32` to IEEE binary16 (round to nearest even; overflow to
//! infinity; NaN stays NaN) packed two per `u32` word — element `2i` in the low half of word `i`,
//! an odd length leaves the last word's high half 0 — and back. This is the memory layout of a
//! little-endian `[u16]`, and of WGSL `pack2x16float` / `unpack2x16float`.

/// The binary16 bits of `v`, rounded to nearest even (subnormal halves included).
pub fn f32_to_f16_bits(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let magnitude = bits & 0x7fff_ffff;
    if magnitude > 0x7f80_0000 {
        return sign | 0x7e00; // NaN (quiet)
    }
    if magnitude >= 0x477f_f000 {
        return sign | 0x7c00; // >= 65520 rounds to infinity
    }
    if magnitude >= 0x3880_0000 {
        // Normal half (>= 2^-14): rebias the exponent (127 -> 15), keep 10 mantissa bits, round
        // the 13 dropped bits to nearest even; a mantissa carry correctly bumps the exponent.
        let exponent = (magnitude >> 23) - 112;
        let mut half = (exponent << 10) | ((magnitude >> 13) & 0x3ff);
        let dropped = magnitude & 0x1fff;
        if dropped > 0x1000 || (dropped == 0x1000 && half & 1 == 1) {
            half += 1;
        }
        return sign | half as u16;
    }
    // Subnormal half or zero: units of 2^-24, rounded to nearest even (1024 units is the
    // smallest normal, whose bit pattern is exactly 0x0400).
    let units = (f64::from(f32::from_bits(magnitude)) * 16_777_216.0).round_ties_even();
    sign | units as u16
}

/// The `f32` value of binary16 bits `h` (exact).
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exponent = (h >> 10) & 0x1f;
    let mantissa = u32::from(h & 0x3ff);
    match exponent {
        0 => sign * mantissa as f32 / 16_777_216.0, // subnormal: m * 2^-24
        31 if mantissa == 0 => sign * f32::INFINITY,
        31 => f32::NAN,
        _ => f32::from_bits(
            (u32::from(h & 0x8000) << 16) | ((u32::from(exponent) + 112) << 23) | (mantissa << 13),
        ),
    }
}

/// Packs `x` as halves, two per word: `ceil(x.len() / 2)` words.
pub fn pack_f16(x: &[f32]) -> Vec<u32> {
    x.chunks(2)
        .map(|pair| {
            let lo = u32::from(f32_to_f16_bits(pair[0]));
            let hi = pair.get(1).map_or(0, |&v| u32::from(f32_to_f16_bits(v)));
            lo | (hi << 16)
        })
        .collect()
}

/// Unpacks the first `n` halves of `words` to `f32`.
pub fn unpack_f16(words: &[u32], n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let word = words[i / 2];
            let half = if i % 2 == 0 {
                word & 0xffff
            } else {
                word >> 16
            };
            f16_bits_to_f32(half as u16)
        })
        .collect()
}

/// `f32 -> f16 -> f32`: the value a round trip through half storage gives.
pub fn round_to_f16(x: &[f32]) -> Vec<f32> {
    unpack_f16(&pack_f16(x), x.len())
}
