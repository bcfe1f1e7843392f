//! `conv2d`'s matmul path: one group's convolution as the tuned matmul over columns of the
//! input's taps (`im2col`), a chunk of images at a time, the whole unfolded input never held.

use plimsoll_allocator::Category;

use super::{BIAS_ADD, CHANNELS_FIRST, COL2IM, Conv2dDims, IM2COL, Params, range};
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::matmul::{self, MatmulDims};
use crate::kernels::{check_loop_limit, launch_units};
use crate::pipeline::Kernel;
use crate::slice::DeviceSlice;

/// The most bytes of columns (or of their gradient) the matmul path holds at once: a chunk of
/// images whose columns fit, at least one image.
pub const COLUMNS_BYTES: u64 = 32 << 20;

/// Images a chunk of the matmul path holds: as many as fit [`COLUMNS_BYTES`] and a binding
/// (`K · P` columns an image, `K = C · KH · KW`, `P = OH · OW`; the weight's gradient also
/// holds `O · P` per image) and keep the weight gradient's product (`k = images · P`) within
/// the loop limit; 0 when not even one image does.
pub(crate) fn images_per_chunk(gpu: &Gpu, dims: &Conv2dDims) -> u64 {
    let Ok([oh, ow]) = dims.out_size() else {
        return 0;
    };
    let (rows, plane) = (dims.weight_len() / dims.out_channels.max(1), (oh * ow).max(1));
    let per_image = 4 * plane * rows.max(dims.out_channels);
    let bytes = COLUMNS_BYTES.min(gpu.max_buffer_bytes());
    let mut images = (bytes / per_image.max(1)).min(dims.batch.max(1));
    if let Some(limit) = gpu.loop_iteration_limit() {
        // main_scalar's k loop: k + 1 passes (matmul::loop_iterations), for k = K, O, images · P.
        if rows.max(dims.out_channels) + 1 > limit {
            return 0;
        }
        images = images.min((limit - 1) / plane);
    }
    images
}

/// The shape checks every matmul-path launcher starts with; returns `(K, P, images a chunk)`
/// (at most `chunk` images when given: tests split a batch into several chunks).
fn matmul_shape(
    gpu: &Gpu,
    dims: &Conv2dDims,
    op: &'static str,
    chunk: Option<u64>,
) -> Result<(u64, u64, u64)> {
    dims.check()?;
    let fits = images_per_chunk(gpu, dims);
    let images = chunk.map_or(fits, |c| c.clamp(1, fits.max(1)).min(fits));
    if dims.groups != 1 || images == 0 {
        return Err(Error::InvalidArgument {
            op,
            message: format!(
                "the matmul path takes one group and columns of one image within {COLUMNS_BYTES} \
                 bytes and the loop limit ({} groups here); use the direct path",
                dims.groups
            ),
        });
    }
    let [oh, ow] = dims.out_size_unchecked();
    Ok((dims.weight_len() / dims.out_channels, oh * ow, images))
}

/// Records `launch` over `count` elements of `kernel` with `params` (in ranges under a
/// submission bound).
fn elementwise(
    gpu: &Gpu,
    kernel: &Kernel,
    buffers: &[DeviceSlice<'_>],
    count: u64,
    params: Params,
) -> Result<()> {
    launch_units(gpu, kernel, &[], buffers, count, |s, e| {
        (range(params, s, e), e - s)
    })
}

/// Each chunk of at most `images` images: `(first image, images in it)`.
fn chunks(batch: u64, images: u64) -> impl Iterator<Item = (u64, u64)> {
    let images = images.max(1);
    (0..batch.div_ceil(images)).map(move |c| (c * images, images.min(batch - c * images)))
}

/// [`forward`] on the matmul path: per chunk of images, the columns (image-major) and one
/// batched product `y[n] = W · cols[n]`, `[O, K] · [K, P]`; then the bias.
pub(crate) fn forward_matmul(
    gpu: &Gpu,
    dims: &Conv2dDims,
    y: DeviceSlice<'_>,
    x: DeviceSlice<'_>,
    weight: DeviceSlice<'_>,
    bias: Option<DeviceSlice<'_>>,
    chunk: Option<u64>,
) -> Result<()> {
    let op = "conv2d::forward";
    let (rows, plane, images) = matmul_shape(gpu, dims, op, chunk)?;
    x.expect_len(op, "x", dims.input_len())?;
    weight.expect_len(op, "weight", dims.weight_len())?;
    y.expect_len(op, "y", dims.output_len())?;
    if let Some(b) = bias {
        b.expect_len(op, "bias", dims.out_channels)?;
    }
    let o = dims.out_channels;
    let cols = gpu.alloc_elements(images * rows * plane, Category::Temporary, "conv2d columns")?;
    for (first, count) in chunks(dims.batch, images) {
        let cols = cols.slice(0, count * rows * plane)?;
        let params = Params {
            n_first: first as u32,
            nb: count as u32,
            image_major: 1,
            x_offset: x.index(),
            c_offset: cols.index(),
            ..dims.params()
        };
        elementwise(gpu, &IM2COL, &[x, cols], count * rows * plane, params)?;
        let product = MatmulDims {
            batch_stride_a: 0,
            ..MatmulDims::dense(count as usize, o as usize, plane as usize, rows as usize)
        };
        let out = y.slice(first * o * plane, count * o * plane)?;
        matmul::matmul(gpu, &product, out, weight, cols)?;
    }
    if let Some(b) = bias {
        let params = Params {
            y_offset: y.index(),
            b_offset: b.index(),
            ..dims.params()
        };
        elementwise(gpu, &BIAS_ADD, &[y, b], dims.output_len(), params)?;
    }
    Ok(())
}

/// [`backward_input`] on the matmul path: per chunk of images, the columns' gradients
/// `dcols[n] = Wᵀ · gy[n]`, `[K, O] · [O, P]` (one batched product), then `col2im`.
pub(crate) fn backward_input_matmul(
    gpu: &Gpu,
    dims: &Conv2dDims,
    dx: DeviceSlice<'_>,
    gy: DeviceSlice<'_>,
    weight: DeviceSlice<'_>,
    chunk: Option<u64>,
) -> Result<()> {
    let op = "conv2d::backward_input";
    let (rows, plane, images) = matmul_shape(gpu, dims, op, chunk)?;
    dx.expect_len(op, "dx", dims.input_len())?;
    gy.expect_len(op, "gy", dims.output_len())?;
    weight.expect_len(op, "weight", dims.weight_len())?;
    let taps = dims.kernel[0] * dims.kernel[1];
    check_loop_limit(gpu, op, "kernel taps", taps, |t| t + 1)?;
    let o = dims.out_channels;
    let image = dims.input_len() / dims.batch.max(1);
    let dcols = gpu.alloc_elements(images * rows * plane, Category::Temporary, "conv2d dcolumns")?;
    for (first, count) in chunks(dims.batch, images) {
        let dcols = dcols.slice(0, count * rows * plane)?;
        let product = MatmulDims {
            trans_a: true,
            batch_stride_a: 0,
            batch_stride_b: (o * plane) as usize,
            ..MatmulDims::dense(count as usize, rows as usize, plane as usize, o as usize)
        };
        let grads = gy.slice(first * o * plane, count * o * plane)?;
        matmul::matmul(gpu, &product, dcols, weight, grads)?;
        let params = Params {
            n_first: first as u32,
            nb: count as u32,
            x_offset: dx.index(),
            c_offset: dcols.index(),
            ..dims.params()
        };
        elementwise(gpu, &COL2IM, &[dcols, dx], count * image, params)?;
    }
    Ok(())
}

/// [`backward_weight`] on the matmul path: per chunk of images, the columns (position-major,
/// `[K, images · P]`) and `gy` permuted to `[O, images · P]`, then one product
/// `dW (+)= gyᵀ · colsᵀ`, `[O, images · P] · [images · P, K]`, each chunk's added to the last.
pub(crate) fn backward_weight_matmul(
    gpu: &Gpu,
    dims: &Conv2dDims,
    dweight: DeviceSlice<'_>,
    x: DeviceSlice<'_>,
    gy: DeviceSlice<'_>,
    chunk: Option<u64>,
) -> Result<()> {
    let op = "conv2d::backward_weight";
    let (rows, plane, images) = matmul_shape(gpu, dims, op, chunk)?;
    dweight.expect_len(op, "dweight", dims.weight_len())?;
    x.expect_len(op, "x", dims.input_len())?;
    gy.expect_len(op, "gy", dims.output_len())?;
    let o = dims.out_channels;
    let cols = gpu.alloc_elements(images * rows * plane, Category::Temporary, "conv2d columns")?;
    let gyt = gpu.alloc_elements(images * o * plane, Category::Temporary, "conv2d gy by channel")?;
    if dims.batch == 0 {
        // No image: a zero gradient (the product over k = 0).
        let product = MatmulDims::dense(1, o as usize, rows as usize, 0);
        return matmul::matmul(gpu, &product, dweight, cols.slice(0, 0)?, cols.slice(0, 0)?);
    }
    for (first, count) in chunks(dims.batch, images) {
        let (cols, gyt) = (cols.slice(0, count * rows * plane)?, gyt.slice(0, count * o * plane)?);
        let base = Params {
            n_first: first as u32,
            nb: count as u32,
            x_offset: x.index(),
            y_offset: gy.index(),
            ..dims.params()
        };
        let columns = Params { c_offset: cols.index(), ..base };
        elementwise(gpu, &IM2COL, &[x, cols], count * rows * plane, columns)?;
        let permuted = Params { c_offset: gyt.index(), ..base };
        elementwise(gpu, &CHANNELS_FIRST, &[gy, gyt], count * o * plane, permuted)?;
        let product = MatmulDims {
            trans_b: true,
            accumulate: first > 0,
            ..MatmulDims::dense(1, o as usize, rows as usize, (count * plane) as usize)
        };
        matmul::matmul(gpu, &product, dweight, gyt, cols)?;
    }
    Ok(())
}

