// optimizer: fused, in-place SGD and AdamW steps with PyTorch's semantics and operation order
// (torch.optim.SGD / torch.optim.AdamW, single-tensor path, maximize=False, amsgrad=False).
// Reference: reference.rs, beside this file. Host-side scalars (1 - beta1, lr / (1 - beta1^t),
// sqrt(1 - beta2^t), 1 - lr*wd, 1 - dampening) are computed in f64 and rounded to f32 once by
// SgdConfig::scalars / AdamWConfig::scalars(step); write those values into the Params below.
// grad_scale multiplies the gradient first (mixed-precision unscale, 1/loss_scale; 1 otherwise).
// With `controlled` = 1 the step is decided on the device (`step_control`, below): the gradient
// is multiplied by control[control_offset] instead of grad_scale, and nothing is written when
// control[control_offset + 1] is not 0 (the step is skipped). With 0 the `control` binding is
// never read (the launcher binds the gradient there).
//
//   sgd:   g = grad*grad_scale (+ weight_decay * p if weight_decay != 0)
//          if momentum != 0: buf = first_step ? g : momentum*buf + (1 - dampening)*g
//                            g = nesterov ? g + momentum*buf : buf
//          p = p + (-lr) * g
//   adamw: g = grad*grad_scale; p *= 1 - lr*wd; m += (1 - b1)(g - m);  (PyTorch's lerp)
//          v = v*b2 + (1 - b2) g^2; p += -step_size * m / (sqrt(v)/sqrt(bc2) + eps),
//          step_size = lr / bc1, bc1 = 1 - b1^t, bc2 = 1 - b2^t (t = 1 on the first step).
//
// Entry points (all @workgroup_size(256)): sgd, adamw (one invocation per parameter element),
// adamw_v4 (four elements per invocation), adamw_multi (a workgroup per chunk of many tensors),
// step_control (one workgroup: the step's decision, below).
//
// Params: SgdParams (sgd) and AdamWParams (adamw), declared in mod.rs
//   (`shader_params!`), prepended with the bindings. nesterov and first_step are 0 or 1;
//   decay_factor = 1 - lr * wd, step_size = lr / bias_correction1.
//   Each *_offset is the element index of that tensor in its binding (the launcher's
//   segment_index: block offset + tensor offset).
// Bindings (group 0; all storage read_write, docs/wgpu.md §4; all array<f32> [n]; each the WHOLE
// segment buffer):
//   sgd:   0 sgd_params, 1 param, 2 grad, 3 momentum_buf (not touched when momentum == 0: bind
//          any buffer, e.g. grad again — both bindings are read_write, which wgpu allows),
//          4 sgd_control
//   adamw: 0 adamw_params, 1 param, 2 grad, 3 exp_avg (m), 4 exp_avg_sq (v), 5 adamw_control
//   adamw_multi: the 16 slots, 17 chunks, 18 multi_control
//   step_control: 0 control_params, 1 sums, 2 decision
//
// Dispatch: groups = ceil(n / 256); (groups, 1, 1) if <= 65535 else
// (65535, ceil(groups / 65535), 1); i = gid.x + gid.y * num_workgroups.x * 256; `i >= n` returns.



const WG: u32 = 256u;

// What multiplies the gradient, and whether the device decided to skip the step (see the top):
// one pair per control binding (`sgd_control`, `adamw_control`, `multi_control`).
fn sgd_grad_scale() -> f32 {
    if (sgd_params.controlled != 0u) {
        return sgd_control[sgd_params.control_offset];
    }
    return sgd_params.grad_scale;
}

fn sgd_skipped() -> bool {
    return sgd_params.controlled != 0u && sgd_control[sgd_params.control_offset + 1u] != 0.0;
}

fn adamw_grad_scale() -> f32 {
    if (adamw_params.controlled != 0u) {
        return adamw_control[adamw_params.control_offset];
    }
    return adamw_params.grad_scale;
}

fn adamw_skipped() -> bool {
    return adamw_params.controlled != 0u && adamw_control[adamw_params.control_offset + 1u] != 0.0;
}

fn multi_grad_scale() -> f32 {
    if (adamw_params.controlled != 0u) {
        return multi_control[adamw_params.control_offset];
    }
    return adamw_params.grad_scale;
}

fn multi_skipped() -> bool {
    return adamw_params.controlled != 0u && multi_control[adamw_params.control_offset + 1u] != 0.0;
}

@compute @workgroup_size(256)
fn sgd(@builtin(global_invocation_id) gid: vec3<u32>,
       @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= sgd_params.n || sgd_skipped()) {
        return;
    }
    let pi = sgd_params.param_offset + i;
    let mi = sgd_params.momentum_offset + i;
    let p = param[pi];
    var g = grad[sgd_params.grad_offset + i] * sgd_grad_scale();
    if (sgd_params.weight_decay != 0.0) {
        g += sgd_params.weight_decay * p;   // L2 penalty folded into the gradient
    }
    if (sgd_params.momentum != 0.0) {
        var buf = g;                        // first step: buf = g (no dampening)
        if (sgd_params.first_step == 0u) {
            buf = momentum_buf[mi] * sgd_params.momentum + sgd_params.one_minus_dampening * g;
        }
        momentum_buf[mi] = buf;
        if (sgd_params.nesterov != 0u) {
            g = g + sgd_params.momentum * buf;
        } else {
            g = buf;
        }
    }
    param[pi] = p + (-sgd_params.lr) * g;
}

// The AdamW update of four elements (PyTorch's operations in PyTorch's order, per component);
// `adamw` runs it on one element splatted to all four, `adamw_v4` on four.
struct AdamWState {
    p: vec4<f32>,
    m: vec4<f32>,
    v: vec4<f32>,
}

fn adamw_update(param_in: vec4<f32>, grad_in: vec4<f32>, m_in: vec4<f32>,
                v_in: vec4<f32>, decay_factor: f32, grad_scale: f32) -> AdamWState {
    let g = grad_in * grad_scale;
    let p = param_in * decay_factor;                                // decoupled weight decay
    let m = m_in + adamw_params.one_minus_beta1 * (g - m_in);      // m = b1 m + (1 - b1) g
    let v = v_in * adamw_params.beta2 + adamw_params.one_minus_beta2 * g * g;
    let denom = sqrt(v) / adamw_params.bias_correction2_sqrt + adamw_params.eps;
    return AdamWState(p + (-adamw_params.step_size) * (m / denom), m, v);
}

@compute @workgroup_size(256)
fn adamw(@builtin(global_invocation_id) gid: vec3<u32>,
         @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= adamw_params.n || adamw_skipped()) {
        return;
    }
    let pi = adamw_params.param_offset + i;
    let mi = adamw_params.exp_avg_offset + i;
    let vi = adamw_params.exp_avg_sq_offset + i;
    let s = adamw_update(vec4<f32>(param[pi]), vec4<f32>(grad[adamw_params.grad_offset + i]),
                         vec4<f32>(exp_avg[mi]), vec4<f32>(exp_avg_sq[vi]),
                         adamw_params.decay_factor, adamw_grad_scale());
    exp_avg[mi] = s.m.x;
    exp_avg_sq[vi] = s.v.x;
    param[pi] = s.p.x;
}

// adamw_v4: `adamw` on four elements per invocation through vec4 views of the same bindings
// (param_v4, grad_v4, exp_avg_v4, exp_avg_sq_v4). n counts vec4s and every *_offset is in vec4s
// (the launcher uses it only when all four element offsets are multiples of 4, and runs the
// last len % 4 elements through `adamw`). Same operations in the same order per component; on
// lavapipe each storage access is a per-lane loop, so a vec4 access moves four elements for one.
@compute @workgroup_size(256)
fn adamw_v4(@builtin(global_invocation_id) gid: vec3<u32>,
            @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= adamw_params.n || adamw_skipped()) {
        return;
    }
    let pi = adamw_params.param_offset + i;
    let mi = adamw_params.exp_avg_offset + i;
    let vi = adamw_params.exp_avg_sq_offset + i;
    let s = adamw_update(param_v4[pi], grad_v4[adamw_params.grad_offset + i], exp_avg_v4[mi],
                         exp_avg_sq_v4[vi], adamw_params.decay_factor, adamw_grad_scale());
    exp_avg_v4[mi] = s.m;
    exp_avg_sq_v4[vi] = s.v;
    param_v4[pi] = s.p;
}

// adamw_multi: `adamw_v4` over many tensors in one dispatch (PyTorch's multi-tensor `foreach`
// path, in one launch instead of one per parameter). The tensors' segments are bound once each
// at slot_0 .. slot_15 (shaders/slots.wgsl), and `chunks` (array<u32>) lists 8 words per chunk
// of at most CHUNK_VEC4S vec4s of one tensor:
//   0: the slots of param, grad, exp_avg and exp_avg_sq, a byte each from the low byte;
//   1-4: their vec4 offsets in those slots; 5: the chunk's vec4 count;
//   6: its decay factor's bits (1 - lr*wd, or 1.0 for a tensor that is not decayed); 7: 0.
// The table starts at element adamw_params.param_offset of its binding. One workgroup per
// chunk: chunk adamw_params.first_chunk + the workgroup's index, below adamw_params.n (the
// dispatch's chunk count), so an operand's slot is the same for the whole workgroup. Same
// operations in the same order as `adamw`.
const CHUNK_VEC4S: u32 = 2048u;   // multi.rs's CHUNK_VEC4S

@compute @workgroup_size(256)
fn adamw_multi(@builtin(workgroup_id) wg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = row_of(wg, nwg);
    if (w >= adamw_params.n || multi_skipped()) {
        return;
    }
    let c = adamw_params.param_offset + (adamw_params.first_chunk + w) * 8u;
    let slots = chunks[c];
    let ps = slots & 0xffu;
    let gs = (slots >> 8u) & 0xffu;
    let ms = (slots >> 16u) & 0xffu;
    let vs = slots >> 24u;
    // At most a chunk's worth whatever the table says (a warm-up's zeroed table, a bad one):
    // the loop always ends.
    let count = min(chunks[c + 5u], CHUNK_VEC4S);
    let decay_factor = bitcast<f32>(chunks[c + 6u]);
    let grad_scale = multi_grad_scale();
    for (var j = lid; j < count; j += WG) {
        let pi = chunks[c + 1u] + j;
        let mi = chunks[c + 3u] + j;
        let vi = chunks[c + 4u] + j;
        let s = adamw_update(slot_load(ps, pi), slot_load(gs, chunks[c + 2u] + j),
                             slot_load(ms, mi), slot_load(vs, vi), decay_factor, grad_scale);
        slot_store(ms, mi, s.m);
        slot_store(vs, vi, s.v);
        slot_store(ps, pi, s.p);
    }
}

// step_control: the step's decision on the device, so that the update can be recorded before
// the host has read the step's sums (the host reads them later, while the device goes on).
// One workgroup of 256 invocations. `sums` holds, from control_params.sums_offset, `n` partial
// sums of squares of every gradient (the step's read-back after its loss), and at flags_offset
// the `nonfinite` kernel's first flag word (u32 bits: not 0 when the loss or a sum is not
// finite). decision[control_offset ..+ 4] becomes [grad_scale, skip, halted, norm]:
//   sum      = the partials summed in f32: invocation l adds elements l, l + 256, ... in order,
//              then a tree (l += l + 128, then + 64, ... + 1); reference.rs's `step_control`;
//   norm     = sqrt(sum) / loss_scale;
//   skip     = 1 when the flag is set, the norm is not finite, or halted was already 1 (a
//              skipped step halts every update recorded after it until the host writes 0
//              there: the steps queued behind a failed one leave the model as it was);
//   halted   = skip;
//   clip     = max_norm / (norm + 1e-6) when max_norm > 0 and norm > max_norm, else 1
//              (torch.nn.utils.clip_grad_norm_'s rule);
//   grad_scale = clip / loss_scale (what the update multiplies each gradient by).
var<workgroup> control_partial: array<f32, 256>;

@compute @workgroup_size(256)
fn step_control(@builtin(local_invocation_index) lid: u32) {
    var sum = 0.0;
    for (var i = lid; i < control_params.n; i += WG) {
        sum += sums[control_params.sums_offset + i];
    }
    control_partial[lid] = sum;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (lid < stride) {
            control_partial[lid] += control_partial[lid + stride];
        }
        workgroupBarrier();
    }
    if (lid != 0u) {
        return;
    }
    let o = control_params.control_offset;
    let flagged = bitcast<u32>(sums[control_params.flags_offset]) != 0u;
    let norm = sqrt(control_partial[0]) / control_params.loss_scale;
    let finite = (bitcast<u32>(norm) & 0x7f800000u) != 0x7f800000u;
    let skip = flagged || !finite || decision[o + 2u] != 0.0;
    var clip = 1.0;
    if (control_params.max_norm > 0.0 && norm > control_params.max_norm) {
        clip = control_params.max_norm / (norm + 1e-6);
    }
    decision[o] = clip / control_params.loss_scale;
    decision[o + 1u] = select(0.0, 1.0, skip);
    decision[o + 2u] = select(0.0, 1.0, skip);
    decision[o + 3u] = norm;
}
