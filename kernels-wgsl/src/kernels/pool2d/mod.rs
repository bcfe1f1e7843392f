//! `pool2d`: PyTorch's `MaxPool2d`, `AvgPool2d` and `AdaptiveAvgPool2d` over the `(n, c)`
//! planes of NCHW tensors, forward and backward. The family in one place: its shader
//! (`pool2d.wgsl`, beside this file: the formulas), its launchers, its CPU
//! [`reference`](mod@reference) and its kernel tests. Max pooling writes each output's arg-max
//! (its position `ih · W + iw` in the plane, u32), which the backward reads; no atomics.

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{
    check_loop_limit, check_u32_elements, check_window, launch_units, window_positions,
};
use crate::pipeline::{Kernel, kernels, shader_params, shader_source};
use crate::slice::DeviceSlice;

/// The module: `pool2d.wgsl` and the helpers it calls.
const WGSL: &str = const_format::concatcp!(
    include_str!("pool2d.wgsl"),
    shader_source!("indexing", "float_bits", "window")
);

kernels! {
    "pool2d", source: WGSL, workgroup: crate::kernels::ELEMENTWISE_WORKGROUP;
    /// Max pooling and its arg-max, an invocation per output element.
    MAX_FORWARD = "max_forward" [x, y, idx: "array<u32>"];
    /// Max pooling's `dx`, an invocation per input element.
    MAX_BACKWARD = "max_backward" [gy, dx, idx: "array<u32>"];
    /// Average pooling (fixed or adaptive windows), an invocation per output element.
    AVG_FORWARD = "avg_forward" [x, y];
    /// Average pooling's `dx`, an invocation per input element.
    AVG_BACKWARD = "avg_backward" [gy, dx];
}

/// Every entry point of the family, in the order [`crate::kernels::ALL`] lists them.
pub const KERNELS: &[Kernel] = &[MAX_FORWARD, MAX_BACKWARD, AVG_FORWARD, AVG_BACKWARD];

shader_params! {
    /// The `Params` of `pool2d.wgsl` (shared by its entry points).
    struct Params {
        in_h: u32,
        in_w: u32,
        out_h: u32,
        out_w: u32,
        k_h: u32,
        k_w: u32,
        stride_h: u32,
        stride_w: u32,
        pad_h: u32,
        pad_w: u32,
        dil_h: u32,
        dil_w: u32,
        /// Averages: 0 padding counted, 1 not, 2 adaptive windows.
        mode: u32,
        /// The first element this dispatch writes, and how many.
        first: u32,
        count: u32,
        x_offset: u32,
        y_offset: u32,
        idx_offset: u32,
        _pad0: u32,
        _pad1: u32,
    }
}

/// A pooling window walked over a plane (PyTorch's `kernel_size`, `stride`, `padding`,
/// `dilation`; `[height, width]` each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolWindow {
    /// Window height and width.
    pub kernel: [u64; 2],
    /// Step between windows (PyTorch's default: the kernel).
    pub stride: [u64; 2],
    /// Implicit padding on each side (-inf for max, zeros for averages).
    pub padding: [u64; 2],
    /// Step between a window's taps (averages: 1).
    pub dilation: [u64; 2],
}

impl PoolWindow {
    /// A `k x k` window moving by `k` (PyTorch's default stride), no padding.
    pub fn square(k: u64) -> PoolWindow {
        PoolWindow {
            kernel: [k, k],
            stride: [k, k],
            padding: [0, 0],
            dilation: [1, 1],
        }
    }
}

/// Which pooling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    /// `MaxPool2d`.
    Max(PoolWindow),
    /// `AvgPool2d` (`count_include_pad`: the divisor is the window's area, PyTorch's default,
    /// rather than its taps inside the image).
    Avg {
        /// The window (dilation must be 1, as PyTorch's `AvgPool2d` has none).
        window: PoolWindow,
        /// Whether padded taps count in the divisor.
        count_include_pad: bool,
    },
    /// `AdaptiveAvgPool2d(out_size)`: output `(oh, ow)` averages rows `floor(oh H / OH)` to
    /// `ceil((oh + 1) H / OH)` and the columns alike.
    AdaptiveAvg {
        /// Output height and width.
        out_size: [u64; 2],
    },
}

/// The shape of a pooling launch: `planes = N · C` planes of `in_size` pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool2dDims {
    /// Planes (`N · C`).
    pub planes: u64,
    /// Input height and width.
    pub in_size: [u64; 2],
    /// The pooling.
    pub pool: Pool,
}

impl Pool2dDims {
    /// Output height and width. Errors as [`Pool2dDims::check`].
    pub fn out_size(&self) -> Result<[u64; 2]> {
        self.check()?;
        Ok(self.out_size_unchecked())
    }

    fn out_size_unchecked(&self) -> [u64; 2] {
        match self.pool {
            Pool::AdaptiveAvg { out_size } => out_size,
            Pool::Max(w) | Pool::Avg { window: w, .. } => [0, 1].map(|i| {
                let window = [w.kernel[i], w.stride[i], w.padding[i], w.dilation[i]];
                window_positions(self.in_size[i], window)
            }),
        }
    }

    /// Input elements.
    pub fn input_len(&self) -> u64 {
        self.planes * self.in_size[0] * self.in_size[1]
    }

    /// Output elements (0 when the shape is refused).
    pub fn output_len(&self) -> u64 {
        self.out_size().map_or(0, |[h, w]| self.planes * h * w)
    }

    /// Refuses zero kernels, strides, dilations or adaptive outputs, padding past half the
    /// (dilated) window (PyTorch's rule), a dilated average, a window larger than the padded
    /// input, and tensors past `u32` indexing, each with the figures.
    pub fn check(&self) -> Result<()> {
        let invalid = |message: String| {
            Err(Error::InvalidArgument {
                op: "pool2d",
                message,
            })
        };
        let window = match self.pool {
            Pool::AdaptiveAvg { out_size } => {
                if out_size.contains(&0) || self.in_size.contains(&0) {
                    return invalid(format!(
                        "adaptive output {out_size:?} and input {:?} must both be at least 1x1",
                        self.in_size
                    ));
                }
                None
            }
            Pool::Max(w) => Some(w),
            Pool::Avg { window, .. } => {
                if window.dilation != [1, 1] {
                    return invalid(format!(
                        "average pooling has no dilation (got {:?})",
                        window.dilation
                    ));
                }
                Some(window)
            }
        };
        if let Some(w) = window {
            let parts = [("kernel", w.kernel), ("stride", w.stride), ("dilation", w.dilation)];
            if let Some((name, v)) = parts.iter().find(|(_, v)| v.contains(&0)) {
                return invalid(format!("{name} {v:?} has a 0: each side must be at least 1"));
            }
            for (i, side) in ["height", "width"].into_iter().enumerate() {
                let span = w.dilation[i].saturating_mul(w.kernel[i] - 1).saturating_add(1);
                if w.padding[i] > span / 2 {
                    return invalid(format!(
                        "padding {} of {side} is more than half the window's {span} pixels",
                        w.padding[i]
                    ));
                }
                let window = [w.kernel[i], w.padding[i], w.dilation[i]];
                check_window("pool2d", side, self.in_size[i], window)?;
            }
        }
        let [oh, ow] = self.out_size_unchecked();
        check_u32_elements(
            "pool2d",
            &[
                ("input", &[self.planes, self.in_size[0], self.in_size[1]]),
                ("output", &[self.planes, oh, ow]),
            ],
        )
    }

    /// The `Params` every entry point starts from (no range, no offsets).
    fn params(&self) -> Params {
        let [oh, ow] = self.out_size_unchecked();
        let (window, mode) = match self.pool {
            Pool::Max(w) => (w, 0),
            Pool::Avg {
                window,
                count_include_pad,
            } => (window, u32::from(!count_include_pad)),
            Pool::AdaptiveAvg { .. } => (PoolWindow::square(1), 2),
        };
        let u = |v: u64| v as u32;
        Params {
            in_h: u(self.in_size[0]),
            in_w: u(self.in_size[1]),
            out_h: u(oh),
            out_w: u(ow),
            k_h: u(window.kernel[0]),
            k_w: u(window.kernel[1]),
            stride_h: u(window.stride[0]),
            stride_w: u(window.stride[1]),
            pad_h: u(window.padding[0]),
            pad_w: u(window.padding[1]),
            dil_h: u(window.dilation[0]),
            dil_w: u(window.dilation[1]),
            mode,
            ..Params::default()
        }
    }

    /// Loop passes of one forward and one backward invocation at most (see "Loop limit on
    /// lavapipe" in [`crate::kernels`]).
    pub fn loop_passes(&self) -> [u64; 2] {
        match self.pool {
            Pool::Max(w) => [w.kernel[0] * w.kernel[1] + 1; 2],
            Pool::Avg {
                window: w,
                count_include_pad,
            } => {
                let taps = w.kernel[0] * w.kernel[1] + 1;
                // Without padding counted, each divisor counts the taps again.
                let divisor = if count_include_pad { 0 } else { taps };
                [taps + divisor, taps * (1 + divisor)]
            }
            Pool::AdaptiveAvg { out_size } => {
                let [oh, ow] = out_size;
                let side = |i: usize, o: u64| self.in_size[i].div_ceil(o.max(1)) + 1;
                [side(0, oh) * side(1, ow) + 1, oh * ow + 1]
            }
        }
    }
}

/// Records the pooling of `x` into `y`; max pooling also writes each output's arg-max into
/// `idx` (u32, `y`'s length; `None` for averages).
pub fn forward(
    gpu: &Gpu,
    dims: &Pool2dDims,
    y: DeviceSlice<'_>,
    idx: Option<DeviceSlice<'_>>,
    x: DeviceSlice<'_>,
) -> Result<()> {
    let op = "pool2d::forward";
    let kernel = prepare(gpu, dims, op, 0, x, y, idx)?;
    let base = Params {
        x_offset: x.index(),
        y_offset: y.index(),
        idx_offset: idx.map_or(0, |i| i.index()),
        ..dims.params()
    };
    let buffers = match idx {
        Some(idx) => vec![x, y, idx],
        None => vec![x, y],
    };
    launch_units(gpu, kernel, &[], &buffers, dims.output_len(), |s, e| {
        (range(base, s, e), e - s)
    })
}

/// Records `dx` of the pooling from `gy`, `y`'s gradient (max pooling: with the forward's
/// `idx`).
pub fn backward(
    gpu: &Gpu,
    dims: &Pool2dDims,
    dx: DeviceSlice<'_>,
    gy: DeviceSlice<'_>,
    idx: Option<DeviceSlice<'_>>,
) -> Result<()> {
    let op = "pool2d::backward";
    let kernel = prepare(gpu, dims, op, 1, dx, gy, idx)?;
    let base = Params {
        x_offset: dx.index(),
        y_offset: gy.index(),
        idx_offset: idx.map_or(0, |i| i.index()),
        ..dims.params()
    };
    let buffers = match idx {
        Some(idx) => vec![gy, dx, idx],
        None => vec![gy, dx],
    };
    launch_units(gpu, kernel, &[], &buffers, dims.input_len(), |s, e| {
        (range(base, s, e), e - s)
    })
}

/// Checks the shape, the slices' lengths (the input-shaped `x` or `dx`, the output-shaped `y`
/// or `gy`, the arg-max) and the loop limit of direction `side` (0 forward, 1 backward);
/// returns its kernel.
fn prepare(
    gpu: &Gpu,
    dims: &Pool2dDims,
    op: &'static str,
    side: usize,
    in_shaped: DeviceSlice<'_>,
    out_shaped: DeviceSlice<'_>,
    idx: Option<DeviceSlice<'_>>,
) -> Result<&'static Kernel> {
    dims.check()?;
    let (in_name, out_name) = if side == 0 { ("x", "y") } else { ("dx", "gy") };
    in_shaped.expect_len(op, in_name, dims.input_len())?;
    out_shaped.expect_len(op, out_name, dims.output_len())?;
    let max = matches!(dims.pool, Pool::Max(_));
    match idx {
        Some(idx) if max => idx.expect_len(op, "idx", dims.output_len())?,
        None if !max => {}
        _ => {
            return Err(Error::InvalidArgument {
                op,
                message: format!(
                    "max pooling takes an arg-max slice and averages none ({:?} given one: {})",
                    dims.pool,
                    idx.is_some()
                ),
            });
        }
    }
    if dims.output_len() > 0 {
        let passes = dims.loop_passes()[side];
        check_loop_limit(gpu, op, "window taps", passes, |p| p)?;
    }
    Ok(match (max, side) {
        (true, 0) => &MAX_FORWARD,
        (true, _) => &MAX_BACKWARD,
        (false, 0) => &AVG_FORWARD,
        (false, _) => &AVG_BACKWARD,
    })
}

/// `base` for the elements `s..e` a dispatch writes.
fn range(base: Params, s: u64, e: u64) -> Params {
    Params {
        first: s as u32,
        count: (e - s) as u32,
        ..base
    }
}

/// CPU reference, in `f64`.
pub mod reference {
    use super::{Pool, Pool2dDims};
    use crate::kernels::{narrow, widen};

    /// Each output element with the input positions (in its plane) its window averages or
    /// maximises, and the divisor of an average.
    fn windows(dims: &Pool2dDims) -> Vec<(usize, Vec<usize>, f64)> {
        let [oh_n, ow_n] = dims.out_size_unchecked().map(|v| v as usize);
        let [h, w] = dims.in_size.map(|v| v as usize);
        let mut out = Vec::new();
        for oh in 0..oh_n {
            for ow in 0..ow_n {
                let (taps, divisor) = match dims.pool {
                    Pool::AdaptiveAvg { .. } => {
                        let rows = (oh * h / oh_n)..((oh + 1) * h).div_ceil(oh_n);
                        let cols = (ow * w / ow_n)..((ow + 1) * w).div_ceil(ow_n);
                        let taps: Vec<usize> = rows
                            .flat_map(|r| cols.clone().map(move |c| r * w + c))
                            .collect();
                        let n = taps.len() as f64;
                        (taps, n)
                    }
                    Pool::Max(win) | Pool::Avg { window: win, .. } => {
                        let d = |v: [u64; 2]| v.map(|v| v as usize);
                        let ([kh, kw], [sh, sw]) = (d(win.kernel), d(win.stride));
                        let ([ph, pw], [dh, dw]) = (d(win.padding), d(win.dilation));
                        let mut taps = Vec::new();
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let (ih, iw) = (oh * sh + ky * dh, ow * sw + kx * dw);
                                if ih >= ph && iw >= pw && ih - ph < h && iw - pw < w {
                                    taps.push((ih - ph) * w + iw - pw);
                                }
                            }
                        }
                        let area = (kh * kw) as f64;
                        let divisor = match dims.pool {
                            Pool::Avg {
                                count_include_pad: false,
                                ..
                            } => taps.len() as f64,
                            _ => area,
                        };
                        (taps, divisor)
                    }
                };
                out.push((oh * ow_n + ow, taps, divisor));
            }
        }
        out
    }

    /// The pooled planes and, for max pooling, each output's arg-max (the last NaN's position
    /// where a window holds NaNs, else the first largest).
    pub fn forward_f64(dims: &Pool2dDims, x: &[f64]) -> (Vec<f64>, Vec<u32>) {
        let plane_in = (dims.in_size[0] * dims.in_size[1]) as usize;
        let [oh, ow] = dims.out_size_unchecked();
        let plane_out = (oh * ow) as usize;
        let planes = dims.planes as usize;
        let (mut y, mut idx) = (vec![0.0; planes * plane_out], vec![0u32; planes * plane_out]);
        let windows = windows(dims);
        for p in 0..planes {
            let xs = &x[p * plane_in..(p + 1) * plane_in];
            for (o, taps, divisor) in &windows {
                let at = p * plane_out + o;
                if matches!(dims.pool, Pool::Max(_)) {
                    let mut best: Option<usize> = None;
                    for &t in taps {
                        let better = best.is_none_or(|b| xs[t] > xs[b] || xs[t].is_nan());
                        if better {
                            best = Some(t);
                        }
                    }
                    let b = best.unwrap_or(0);
                    (y[at], idx[at]) = (xs[b], b as u32);
                } else {
                    y[at] = taps.iter().map(|&t| xs[t]).sum::<f64>() / divisor;
                }
            }
        }
        (y, idx)
    }

    /// `dx` from `gy` (max pooling: through the forward's arg-max of `x`).
    pub fn backward_f64(dims: &Pool2dDims, x: &[f64], gy: &[f64]) -> Vec<f64> {
        let plane_in = (dims.in_size[0] * dims.in_size[1]) as usize;
        let [oh, ow] = dims.out_size_unchecked();
        let plane_out = (oh * ow) as usize;
        let (_, idx) = forward_f64(dims, x);
        let mut dx = vec![0.0; dims.input_len() as usize];
        let windows = windows(dims);
        for p in 0..dims.planes as usize {
            for (o, taps, divisor) in &windows {
                let at = p * plane_out + o;
                if matches!(dims.pool, Pool::Max(_)) {
                    dx[p * plane_in + idx[at] as usize] += gy[at];
                } else {
                    for &t in taps {
                        dx[p * plane_in + t] += gy[at] / divisor;
                    }
                }
            }
        }
        dx
    }

    /// [`forward_f64`] in `f32`.
    pub fn forward(dims: &Pool2dDims, x: &[f32]) -> (Vec<f32>, Vec<u32>) {
        let (y, idx) = forward_f64(dims, &widen(x));
        (narrow(&y), idx)
    }

    /// [`backward_f64`] in `f32`.
    pub fn backward(dims: &Pool2dDims, x: &[f32], gy: &[f32]) -> Vec<f32> {
        narrow(&backward_f64(dims, &widen(x), &widen(gy)))
    }
}

#[cfg(test)]
pub(crate) mod tests;
