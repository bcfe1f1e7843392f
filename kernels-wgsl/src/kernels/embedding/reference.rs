//! CPU reference for [`embedding`](super): gather rows of a `[vocab, dim]` table by `u32` ids, and the
//! backward scatter-add into a `[vocab, dim]` table gradient. An id `>= vocab` gathers a row of
//! NaN (loud: it reaches the loss) and contributes nothing to the backward.

/// `out[t, j] = table[ids[t], j]`, or NaN if `ids[t] >= vocab`. Output `[ids.len(), dim]`.
pub fn gather(table: &[f32], ids: &[u32], vocab: usize, dim: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(ids.len() * dim);
    for &id in ids {
        let id = id as usize;
        if id < vocab {
            out.extend_from_slice(&table[id * dim..(id + 1) * dim]);
        } else {
            out.extend(std::iter::repeat_n(f32::NAN, dim));
        }
    }
    out
}

/// `dtable[v, j] = sum_{t : ids[t] == v} dy[t, j]` (f64 accumulation, ascending `t`); rows no id
/// refers to are 0. The result is written, not accumulated into an existing gradient.
pub fn scatter_add(ids: &[u32], dy: &[f32], vocab: usize, dim: usize) -> Vec<f32> {
    let mut acc = vec![0.0f64; vocab * dim];
    for (t, &id) in ids.iter().enumerate() {
        let id = id as usize;
        if id < vocab {
            for j in 0..dim {
                acc[id * dim + j] += f64::from(dy[t * dim + j]);
            }
        }
    }
    acc.into_iter().map(|v| v as f32).collect()
}
