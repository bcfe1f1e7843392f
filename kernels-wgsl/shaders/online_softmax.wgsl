// online_softmax.wgsl: the online-softmax recurrence shared by softmax, cross_entropy and their
// workgroup-per-row forms (appended to each module; see the kernels' source declarations): a
// running max m and s = sum of exp(v - m) over the values seen so far, rescaled whenever the
// max grows, so a row's statistics take one pass.

const NEG_INF_BITS: u32 = 0xff800000u;

// Factor taking a sum relative to max m to one relative to m_new >= m (1 when equal: also when
// both are -inf, where exp(m - m_new) would be NaN).
fn rescale(m: f32, m_new: f32) -> f32 {
    return select(exp(m - m_new), 1.0, m == m_new);
}

// What exp(v - shift) subtracts: the max, or 0 while it is -inf (every value so far is -inf and
// contributes exp(-inf) = 0; a row of only -inf ends with s = 0 and NaN outputs, as two passes).
fn shift_of(m: f32) -> f32 {
    return select(m, 0.0, m == bitcast<f32>(NEG_INF_BITS));
}
