//! CPU reference for `dropout`: inverted dropout with a counter-based hash mask, bit-identical
//! to `shaders/dropout.wgsl` (see its header for the hash).

/// PCG's output permutation on `u32` (wrapping), as in the shader.
pub fn pcg(v: u32) -> u32 {
    let state = v.wrapping_mul(747_796_405).wrapping_add(2_891_336_453);
    let word = ((state >> ((state >> 28) + 4)) ^ state).wrapping_mul(277_803_737);
    (word >> 22) ^ word
}

/// Whether element `i` survives dropout with probability `p` under `seed`.
pub fn keep(seed: u64, i: u32, p: f32) -> bool {
    let key = pcg((seed as u32) ^ pcg((seed >> 32) as u32));
    let h = pcg(i ^ key);
    (h >> 8) as f32 * (1.0 / 16_777_216.0) >= p
}

/// The scale of kept elements, `1 / (1 - p)`, rounded to f32 once (the launcher passes it).
pub fn scale(p: f32) -> f32 {
    1.0 / (1.0 - p)
}

/// `y[i] = keep(seed, i, p) ? x[i] * scale(p) : 0`.
pub fn dropout(x: &[f32], p: f32, seed: u64) -> Vec<f32> {
    let s = scale(p);
    x.iter()
        .enumerate()
        .map(|(i, &v)| if keep(seed, i as u32, p) { v * s } else { 0.0 })
        .collect()
}
