// counter_hash: the dropout mask as a counter-based hash of (seed, element index), written once
// for every shader that drops (dropout, attention) and mirrored by
// `kernels::dropout::reference::keep`: PCG's output permutation (Jarzynski & Olano, "Hash
// Functions for GPU Rendering", 2020) on u32 with wrapping arithmetic;
// key = pcg(seed_lo ^ pcg(seed_hi)); h = pcg(i ^ key); kept when f32(h >> 8) * 2^-24 >= p
// (24 bits are exact in f32, so the comparison is identical on the CPU).

fn pcg(v: u32) -> u32 {
    let state = v * 747796405u + 2891336453u;
    let word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
    return (word >> 22u) ^ word;
}

fn dropout_key(seed_lo: u32, seed_hi: u32) -> u32 {
    return pcg(seed_lo ^ pcg(seed_hi));
}

fn dropout_kept(key: u32, i: u32, p: f32) -> bool {
    let h = pcg(i ^ key);
    return f32(h >> 8u) * (1.0 / 16777216.0) >= p;
}
