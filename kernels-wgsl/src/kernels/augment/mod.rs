//! `augment`: a batch of u8 images (four pixels to a u32 word) made normalised f32 on the device,
//! with torchvision's `RandomCrop(size, padding)` and `RandomHorizontalFlip()` drawn per image
//! from a seed, so a loader keeps a quarter of the bytes on the host and uploads a quarter. The
//! draws are a hash of `(seed, image)` (`shaders/counter_hash.wgsl`'s, as dropout's): the same
//! seed gives the same crops here and in [`reference`](mod@reference). In one place: the shader
//! (`augment.wgsl`, beside this file), the launcher, the CPU reference and the test.

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{ELEMENTWISE_WORKGROUP, launch_ranges};
use crate::pipeline::{Kernel, kernel, shader_params};
use crate::slice::DeviceSlice;

/// The `augment` entry point.
pub const KERNEL: Kernel = kernel!(
    "augment",
    "augment",
    source: const_format::concatcp!(
        include_str!("augment.wgsl"),
        crate::pipeline::shader_source!("counter_hash")
    ),
    [pixels: "array<u32>", out],
    ELEMENTWISE_WORKGROUP
);

/// Every entry point of the family, in the order [`crate::kernels::ALL`] lists them.
pub const KERNELS: &[Kernel] = &[
    KERNEL,
];

/// The most channels an image may have (the per-channel mean and scale travel in `Params`).
pub const MAX_CHANNELS: usize = 4;

shader_params! {
    /// The `Params` of `augment.wgsl`.
    struct Params {
        len: u32,
        start: u32,
        pixels_offset: u32,
        out_offset: u32,
        channels: u32,
        height: u32,
        width: u32,
        pad: u32,
        flips: u32,
        seed_lo: u32,
        seed_hi: u32,
        _pad0: u32,
        mean0: f32,
        mean1: f32,
        mean2: f32,
        mean3: f32,
        inv_std0: f32,
        inv_std1: f32,
        inv_std2: f32,
        inv_std3: f32,
    }
}

/// What [`augment`] makes of a batch: `images` of `[channels, height, width]` u8 pixels, each
/// normalised per channel as `(v / 255 - mean) / std`, after a random crop of the image padded
/// by `pad` zeros on each side (offsets in `[0, 2 pad]`) and, with `flips`, a horizontal flip of
/// half of them. `pad` 0 and no flips is the plain conversion (an evaluation set's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AugmentDims {
    /// Images in the batch.
    pub images: usize,
    /// Channels (at most [`MAX_CHANNELS`]), height, width.
    pub image: [usize; 3],
    /// Zeros around each side of an image before the crop back to its size.
    pub pad: usize,
    /// Whether half of the images (by their hash) are flipped left to right.
    pub flips: bool,
    /// Per channel (the first `channels` are read): subtracted from `v / 255`.
    pub mean: [f32; MAX_CHANNELS],
    /// Per channel: what `v / 255 - mean` is divided by (positive).
    pub std: [f32; MAX_CHANNELS],
}

impl AugmentDims {
    /// Pixels (and outputs) in the batch.
    pub fn elements(&self) -> u64 {
        let [c, h, w] = self.image;
        (self.images as u64) * (c as u64) * (h as u64) * (w as u64)
    }

    /// u32 words holding the batch's pixels, four to a word.
    pub fn words(&self) -> u64 {
        self.elements().div_ceil(4)
    }

    fn check(&self) -> Result<()> {
        let bad = |message: String| Error::InvalidArgument {
            op: "augment",
            message,
        };
        let [c, h, w] = self.image;
        if c == 0 || c > MAX_CHANNELS || h == 0 || w == 0 {
            return Err(bad(format!(
                "images of {:?}: need 1 to {MAX_CHANNELS} channels and a height and width of at \
                 least 1",
                self.image
            )));
        }
        if self.pad > h.max(w) {
            return Err(bad(format!(
                "padding {} is larger than the {h}x{w} image: a crop could hold no pixel; give \
                 a padding of at most {}",
                self.pad,
                h.max(w)
            )));
        }
        if let Some(s) = self.std[..c].iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            return Err(bad(format!(
                "standard deviation {s}: each channel's must be positive and finite"
            )));
        }
        if self.mean[..c].iter().any(|m| !m.is_finite()) {
            return Err(bad(format!("mean {:?}: must be finite", &self.mean[..c])));
        }
        if self.elements() > u64::from(u32::MAX) {
            return Err(bad(format!(
                "{} pixels in one batch: at most {} (give fewer images at a time)",
                self.elements(),
                u32::MAX
            )));
        }
        Ok(())
    }
}

/// Records `out = augmented(pixels)` for the batch `dims` describes, the crops and flips drawn
/// from `seed` (see [`reference::draws`]): `out` holds [`AugmentDims::elements`] f32,
/// `pixels` [`AugmentDims::words`] u32 words.
pub fn augment(
    gpu: &Gpu,
    dims: &AugmentDims,
    seed: u64,
    out: DeviceSlice<'_>,
    pixels: DeviceSlice<'_>,
) -> Result<()> {
    dims.check()?;
    let len = dims.elements();
    out.expect_len("augment", "out", len)?;
    pixels.expect_len("augment", "pixels", dims.words())?;
    let [c, h, w] = dims.image;
    let inv = |k: usize| 1.0 / dims.std[k];
    let params = |start, end| Params {
        len: end,
        start,
        pixels_offset: pixels.index(),
        out_offset: out.index(),
        channels: c as u32,
        height: h as u32,
        width: w as u32,
        pad: dims.pad as u32,
        flips: u32::from(dims.flips),
        seed_lo: seed as u32,
        seed_hi: (seed >> 32) as u32,
        mean0: dims.mean[0],
        mean1: dims.mean[1],
        mean2: dims.mean[2],
        mean3: dims.mean[3],
        inv_std0: inv(0),
        inv_std1: inv(1),
        inv_std2: inv(2),
        inv_std3: inv(3),
        ..Params::default()
    };
    launch_ranges(gpu, &KERNEL, &[], &[pixels, out], len, params)
}

/// CPU reference of [`augment`], the same draws and the same f32 arithmetic.
pub mod reference {
    use super::AugmentDims;
    use crate::kernels::dropout::reference::pcg;

    /// Image `n`'s crop offsets `(oy, ox)`, each in `[0, 2 pad]`, and whether it is flipped,
    /// under `seed`.
    pub fn draws(seed: u64, n: u32, pad: u32, flips: bool) -> (u32, u32, bool) {
        let key = pcg((seed as u32) ^ pcg((seed >> 32) as u32));
        let h1 = pcg(n ^ key);
        let h2 = pcg(h1);
        let span = 2 * pad + 1;
        (h1 % span, h2 % span, flips && pcg(h2) & 1 == 1)
    }

    /// The batch `pixels` (`[n, c, h, w]` bytes) augmented as the shader does.
    pub fn augment(dims: &AugmentDims, seed: u64, pixels: &[u8]) -> Vec<f32> {
        let [c, h, w] = dims.image;
        let pad = dims.pad as i64;
        let mut out = Vec::with_capacity(dims.elements() as usize);
        for n in 0..dims.images {
            let (oy, ox, flip) = draws(seed, n as u32, dims.pad as u32, dims.flips);
            for ch in 0..c {
                let inv_std = 1.0 / dims.std[ch];
                for y in 0..h {
                    for x in 0..w {
                        let xs = if flip { w - 1 - x } else { x };
                        let ay = (y + oy as usize) as i64 - pad;
                        let ax = (xs + ox as usize) as i64 - pad;
                        let inside = (0..h as i64).contains(&ay) && (0..w as i64).contains(&ax);
                        let v = if inside {
                            let byte = ((n * c + ch) * h + ay as usize) * w + ax as usize;
                            f32::from(pixels[byte]) / 255.0
                        } else {
                            0.0
                        };
                        out.push((v - dims.mean[ch]) * inv_std);
                    }
                }
            }
        }
        out
    }

    /// `pixels` four to a little-endian u32 word, the last word padded with zeros.
    pub fn pack(pixels: &[u8]) -> Vec<u32> {
        pixels
            .chunks(4)
            .map(|b| {
                let mut word = [0u8; 4];
                word[..b.len()].copy_from_slice(b);
                u32::from_le_bytes(word)
            })
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::{AugmentDims, reference};
    use crate::Result;
    use crate::testing::{DEADLINE, assert_close, gpu_and_rng, scratch};
    use crate::{Category, Error};

    /// Batches of odd sizes (a pixel count not a multiple of 4, so the last word is partial;
    /// an output slice that starts inside its buffer), with and without crops and flips, against
    /// the reference; the draws cover every offset and both flips; bad dimensions are refused.
    #[test]
    pub(crate) fn matches_reference() -> Result<()> {
        let (gpu, mut rng) = gpu_and_rng(41);
        for (images, image, pad, flips, seed) in [
            (1usize, [1usize, 1, 1], 0usize, false, 1u64),
            (3, [3, 5, 7], 2, true, 9),
            (17, [1, 8, 8], 1, true, u64::MAX),
            (64, [3, 32, 32], 4, true, 42),
        ] {
            let dims = AugmentDims {
                images,
                image,
                pad,
                flips,
                mean: [0.49, 0.48, 0.45, 0.0],
                std: [0.25, 0.24, 0.26, 1.0],
            };
            let bytes: Vec<u8> = (0..dims.elements())
                .map(|_| (rng.next_u64() >> 56) as u8)
                .collect();
            let words = reference::pack(&bytes);
            let pixels = gpu.upload(&words, Category::Temporary, "pixels")?;
            let len = dims.elements();
            let out_gpu = scratch(&gpu, len + 5, "out");
            super::augment(&gpu, &dims, seed, out_gpu.slice(5, len)?, pixels.whole())?;
            let got: Vec<f32> = gpu.read(&out_gpu, 5, len, DEADLINE)?;
            let want = reference::augment(&dims, seed, &bytes);
            let to64 = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
            assert_close(
                &format!("augment {images} x {image:?} pad {pad}"),
                &got,
                &to64(&want),
                1e-6,
                1e-6,
            );
        }
        // Over many images every crop offset and both flips are drawn.
        let draws: Vec<_> = (0..400).map(|n| reference::draws(7, n, 2, true)).collect();
        for offset in 0..5 {
            assert!(draws.iter().any(|d| d.0 == offset) && draws.iter().any(|d| d.1 == offset));
        }
        let flipped = draws.iter().filter(|d| d.2).count();
        assert!((150..250).contains(&flipped), "{flipped} of 400 flipped");
        // Five channels, a padding past the image, a zero deviation: refused with the numbers.
        let out = gpu.alloc_elements(16, Category::Temporary, "out")?;
        let pixels = gpu.alloc_elements(4, Category::Temporary, "pixels")?;
        let base = AugmentDims {
            images: 1,
            image: [1, 4, 4],
            pad: 0,
            flips: false,
            mean: [0.0; 4],
            std: [1.0; 4],
        };
        for (dims, says) in [
            (AugmentDims { image: [5, 2, 2], ..base }, "1 to 4 channels"),
            (AugmentDims { pad: 5, ..base }, "padding 5 is larger"),
            (AugmentDims { std: [0.0; 4], ..base }, "standard deviation 0"),
        ] {
            let err = super::augment(&gpu, &dims, 0, out.whole(), pixels.whole())
                .expect_err("must be refused");
            assert!(
                matches!(err, Error::InvalidArgument { .. }) && err.to_string().contains(says),
                "{err}"
            );
        }
        Ok(())
    }
}
