//! CPU reference for `softmax`: softmax and log-softmax over the last axis of a
//! `[rows, cols]` row-major matrix, and their backwards. Numerically stable (the row max is
//! subtracted before `exp`), computed in `f64`.

/// Row max and `log sum_j exp(x_j - max)` of one row, in `f64`.
fn row_max_and_log_sum_exp(row: &[f32]) -> (f64, f64) {
    let max = row
        .iter()
        .map(|&v| f64::from(v))
        .fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
    (max, sum.ln())
}

/// `y[r, j] = exp(x[r, j] - max_r) / sum_k exp(x[r, k] - max_r)`.
pub fn softmax(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut y = Vec::with_capacity(rows * cols);
    for row in x.chunks_exact(cols).take(rows) {
        let (max, lse) = row_max_and_log_sum_exp(row);
        y.extend(row.iter().map(|&v| (f64::from(v) - max - lse).exp() as f32));
    }
    y
}

/// `y[r, j] = x[r, j] - max_r - log sum_k exp(x[r, k] - max_r)`.
pub fn log_softmax(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut y = Vec::with_capacity(rows * cols);
    for row in x.chunks_exact(cols).take(rows) {
        let (max, lse) = row_max_and_log_sum_exp(row);
        y.extend(row.iter().map(|&v| (f64::from(v) - max - lse) as f32));
    }
    y
}

/// Softmax backward from the forward output `y`: `dx = y * (dy - sum_j dy_j y_j)` per row.
pub fn softmax_backward(y: &[f32], dy: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut dx = Vec::with_capacity(rows * cols);
    for (yr, gr) in y.chunks_exact(cols).zip(dy.chunks_exact(cols)).take(rows) {
        let dot: f64 = yr
            .iter()
            .zip(gr)
            .map(|(&a, &b)| f64::from(a) * f64::from(b))
            .sum();
        dx.extend(
            yr.iter()
                .zip(gr)
                .map(|(&a, &b)| (f64::from(a) * (f64::from(b) - dot)) as f32),
        );
    }
    dx
}

/// Log-softmax backward from the forward output `y` (= log-softmax):
/// `dx = dy - exp(y) * sum_j dy_j` per row (`exp(y)` is the softmax).
pub fn log_softmax_backward(y: &[f32], dy: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut dx = Vec::with_capacity(rows * cols);
    for (yr, gr) in y.chunks_exact(cols).zip(dy.chunks_exact(cols)).take(rows) {
        let sum: f64 = gr.iter().map(|&b| f64::from(b)).sum();
        dx.extend(
            yr.iter()
                .zip(gr)
                .map(|(&a, &b)| (f64::from(b) - f64::from(a).exp() * sum) as f32),
        );
    }
    dx
}
