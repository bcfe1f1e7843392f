// softmax_mask: the causal mask of softmax.wgsl and softmax_rows.wgsl, appended to both
// modules (kernels/softmax/mod.rs). Uses the module's `params` (cols, causal), its binding `x`
// and online_softmax.wgsl's NEG_INF_BITS.

// The causal mask (params.causal = T > 0, rows of [.., T, T] scores): row r is query position
// r % T and sees columns j <= r % T; the others read as -inf (exp 0), exactly what adding a mask
// of -1e9 there gives (exp underflows to 0; the row max is a seen column's). 0: every column.
var<private> valid_cols: u32;

fn causal_valid(r: u32) -> u32 {
    return select(params.cols, min(params.cols, r % max(params.causal, 1u) + 1u), params.causal != 0u);
}

// x[b + j] of the current row, or -inf past its valid columns.
fn xv(b: u32, j: u32) -> f32 {
    return select(bitcast<f32>(NEG_INF_BITS), x[b + j], j < valid_cols);
}
