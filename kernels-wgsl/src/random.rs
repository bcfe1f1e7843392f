//! SplitMix64 (Steele, Lea and Flood, 2014): the one host-side random-number generator of the
//! workspace. autograd draws parameter initialisations and dropout seeds from it, nn derives
//! per-tensor seeds, the trainer shuffles data with it, and the tests draw their inputs. It is
//! tiny, seedable, passes BigCrush, and the same seed gives the same stream on every machine.
//! (The dropout *mask* is drawn on the GPU by a PCG hash, `kernels::dropout::reference::keep`.)

/// The SplitMix64 increment: `2^64 / φ`, odd.
pub const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 output function: a bijective mix of the 64 bits of `z`.
pub const fn mix(z: u64) -> u64 {
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A SplitMix64 stream: each draw adds [`GOLDEN_GAMMA`] to the state and returns [`mix`] of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// The stream seeded with `seed`.
    pub const fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The state (what [`SplitMix64::new`] takes to continue this stream exactly).
    pub const fn state(&self) -> u64 {
        self.state
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix(self.state)
    }

    /// Uniform in `[0, 1)`, from the top 24 bits (every value exactly representable in f32).
    pub fn unit_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in `[0, 1)`, from the top 53 bits.
    pub fn unit_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[low, high)` (f32).
    pub fn f32_in(&mut self, low: f32, high: f32) -> f32 {
        low + (high - low) * self.unit_f32()
    }

    /// `len` values uniform in `[low, high)`.
    pub fn vec_f32(&mut self, len: usize, low: f32, high: f32) -> Vec<f32> {
        (0..len).map(|_| self.f32_in(low, high)).collect()
    }

    /// In `0..n` (`0` when `n` is 0), by a modulo: biased by less than `n / 2^64`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first outputs for seed 1234567, from the authors' C reference
    /// (`splitmix64.c`, Vigna), as quoted in many ports.
    #[test]
    fn splitmix64_matches_the_reference_stream() {
        let mut rng = SplitMix64::new(1_234_567);
        let want = [
            6_457_827_717_110_365_317,
            3_203_168_211_198_807_973,
            9_817_491_932_198_370_423,
            4_593_380_528_125_082_431,
            16_408_922_859_458_223_821,
        ];
        for w in want {
            assert_eq!(rng.next_u64(), w);
        }
    }

    #[test]
    fn unit_values_stay_in_range() {
        let mut rng = SplitMix64::new(7);
        for _ in 0..10_000 {
            let (a, b) = (rng.unit_f32(), rng.unit_f64());
            assert!((0.0..1.0).contains(&a) && (0.0..1.0).contains(&b));
            assert!(rng.below(10) < 10);
        }
    }
}
