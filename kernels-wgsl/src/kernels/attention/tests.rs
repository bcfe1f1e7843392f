//! The attention kernels against [`reference`](super::reference): forward and backward at
//! offsets inside guarded buffers, f16 inputs, and the refusals past the head and loop limits.

use super::{AttentionDims, reference};
use crate::testing::{DEADLINE, Rng, assert_close, gpu};
use crate::{Category, DeviceBuffer, Error, Gpu, Result};

/// `data` at element `at` of a buffer of random guards: the kernels must add the offsets.
fn upload_at(gpu: &Gpu, rng: &mut Rng, data: &[f32], at: usize) -> Result<DeviceBuffer> {
    let mut all = rng.vec_f32(at + data.len() + 3, -9.0, 9.0);
    all[at..at + data.len()].copy_from_slice(data);
    gpu.upload(&all, Category::Temporary, "attention test")
}

fn read(gpu: &Gpu, buffer: &DeviceBuffer, at: usize, len: usize) -> Result<Vec<f32>> {
    let all: Vec<f32> = gpu.read_all(buffer, DEADLINE)?;
    Ok(all[at..at + len].to_vec())
}

/// Forward and backward against the reference: one row, rows across the 16-key tiles and
/// the 64-row workgroups, head dimensions not a multiple of 8 and the largest, every
/// tensor at its own offset inside a buffer of guards.
#[test]
pub(crate) fn matches_reference() -> Result<()> {
    let gpu = gpu();
    let mut rng = Rng::new(31);
    // The last cases drop probabilities (the mask is the `dropout` kernel's).
    // Then grouped-query attention: 3 and 2 query heads per key/value head.
    for (heads_batch, time, head_dim, dropout, group) in [
        (3, 1, 1, 0.0, 1),
        (2, 70, 16, 0.0, 1),
        (1, 130, 64, 0.0, 1),
        (2, 33, 100, 0.0, 1),
        (1, 17, 128, 0.0, 1),
        (2, 70, 16, 0.3, 1),
        (1, 130, 24, 0.1, 1),
        (6, 70, 16, 0.0, 3),
        (4, 40, 8, 0.2, 2),
    ] {
        let dims = AttentionDims {
            heads_batch,
            group,
            time,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            dropout,
            seed: 0x1234_5678_9abc_def0 + time,
        };
        let n = (heads_batch * time * head_dim) as usize;
        let kv_n = n / group as usize;
        let stats = (heads_batch * time) as usize;
        let q = rng.vec_f32(n, -2.0, 2.0);
        let k = rng.vec_f32(kv_n, -2.0, 2.0);
        let v = rng.vec_f32(kv_n, -2.0, 2.0);
        let d_o = rng.vec_f32(n, -1.0, 1.0);
        let (want_o, want_lse) = reference::forward(&dims, &q, &k, &v);
        let (want_dq, want_dk, want_dv) = reference::backward(&dims, &q, &k, &v, &d_o);

        let [qb, kb, vb, gb] = [&q, &k, &v, &d_o].map(|x| upload_at(&gpu, &mut rng, x, 5));
        let (qb, kb, vb, gb) = (qb?, kb?, vb?, gb?);
        let zeros = vec![0.0f32; n];
        let zero_stats = vec![0.0f32; stats];
        let ob = upload_at(&gpu, &mut rng, &zeros, 3)?;
        let lb = upload_at(&gpu, &mut rng, &zero_stats, 7)?;
        let db = upload_at(&gpu, &mut rng, &zero_stats, 1)?;
        let dqb = upload_at(&gpu, &mut rng, &zeros, 2)?;
        let dkb = upload_at(&gpu, &mut rng, &zeros[..kv_n], 4)?;
        let dvb = upload_at(&gpu, &mut rng, &zeros[..kv_n], 6)?;
        let (n64, s64, kv64) = (n as u64, stats as u64, kv_n as u64);
        let (q_s, k_s, v_s, g_s) = (
            qb.slice(5, n64)?,
            kb.slice(5, kv64)?,
            vb.slice(5, kv64)?,
            gb.slice(5, n64)?,
        );
        let (o_s, l_s) = (ob.slice(3, n64)?, lb.slice(7, s64)?);
        super::forward(&gpu, &dims, [o_s, l_s], [q_s, k_s, v_s])?;
        super::backward(
            &gpu,
            &dims,
            [
                dqb.slice(2, n64)?,
                dkb.slice(4, kv64)?,
                dvb.slice(6, kv64)?,
                db.slice(1, s64)?,
            ],
            [q_s, k_s, v_s, o_s, l_s, g_s],
        )?;
        let name = |what: &str| {
            format!(
                "attention {what} [{heads_batch}, {time}, {head_dim}], dropout {dropout}, \
                 group {group}"
            )
        };
        assert_close(&name("o"), &read(&gpu, &ob, 3, n)?, &want_o, 1e-5, 1e-4);
        assert_close(&name("lse"), &read(&gpu, &lb, 7, stats)?, &want_lse, 1e-5, 1e-5);
        assert_close(&name("dq"), &read(&gpu, &dqb, 2, n)?, &want_dq, 1e-5, 1e-4);
        assert_close(&name("dk"), &read(&gpu, &dkb, 4, kv_n)?, &want_dk, 1e-5, 1e-4);
        assert_close(&name("dv"), &read(&gpu, &dvb, 6, kv_n)?, &want_dv, 1e-5, 1e-4);
    }
    Ok(())
}

/// The f16 kernels (q, k, v and o packed halves, at odd and even half offsets) against the
/// reference on the f16-rounded values, with grouped heads and dropout: the same figures as
/// the f32 kernels to f32 rounding, since every value is widened as it is loaded.
#[test]
fn f16_inputs_match_the_reference_of_their_rounded_values() -> Result<()> {
    use crate::kernels::convert::Halves;
    use crate::kernels::convert::reference::round_to_f16;
    use crate::testing::upload_halves;
    let gpu = gpu();
    let mut rng = Rng::new(37);
    for (heads_batch, time, head_dim, dropout, group) in
        [(2, 70, 16, 0.0, 1), (6, 33, 24, 0.2, 3), (1, 5, 3, 0.0, 1)]
    {
        let dims = AttentionDims {
            heads_batch,
            group,
            time,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            dropout,
            seed: 99 + time,
        };
        let n = (heads_batch * time * head_dim) as usize;
        let kv_n = n / group as usize;
        let stats = (heads_batch * time) as usize;
        let q = round_to_f16(&rng.vec_f32(n, -2.0, 2.0));
        let k = round_to_f16(&rng.vec_f32(kv_n, -2.0, 2.0));
        let v = round_to_f16(&rng.vec_f32(kv_n, -2.0, 2.0));
        let d_o = rng.vec_f32(n, -1.0, 1.0);
        let (want_o, want_lse) = reference::forward(&dims, &q, &k, &v);
        // The backward reads o as f16: the reference's o, rounded.
        let o_h = round_to_f16(&want_o);
        let (want_dq, want_dk, want_dv) = reference::backward(&dims, &q, &k, &v, &d_o);
        let [qb, kb, vb, ob] = [(&q, 1), (&k, 2), (&v, 3), (&o_h, 0)]
            .map(|(x, at)| upload_halves(&gpu, x, at));
        let (qb, kb, vb, ob) = (qb?, kb?, vb?, ob?);
        let (qh, kh, vh, oh) = (
            Halves::of(&qb, 1, n as u64)?,
            Halves::of(&kb, 2, kv_n as u64)?,
            Halves::of(&vb, 3, kv_n as u64)?,
            Halves::of(&ob, 0, n as u64)?,
        );
        let zeros = vec![0.0f32; n];
        let out = upload_at(&gpu, &mut rng, &zeros, 3)?;
        let lse = upload_at(&gpu, &mut rng, &vec![0.0; stats], 7)?;
        let (n64, s64, kv64) = (n as u64, stats as u64, kv_n as u64);
        super::forward_f16(
            &gpu,
            &dims,
            [out.slice(3, n64)?, lse.slice(7, s64)?],
            [qh, kh, vh],
        )?;
        let name = |what: &str| {
            format!("f16 attention {what} [{heads_batch}, {time}, {head_dim}], group {group}")
        };
        assert_close(&name("o"), &read(&gpu, &out, 3, n)?, &want_o, 1e-5, 1e-4);
        assert_close(&name("lse"), &read(&gpu, &lse, 7, stats)?, &want_lse, 1e-5, 1e-5);
        let g = upload_at(&gpu, &mut rng, &d_o, 2)?;
        let delta = upload_at(&gpu, &mut rng, &vec![0.0; stats], 1)?;
        let dq = upload_at(&gpu, &mut rng, &zeros, 2)?;
        let dk = upload_at(&gpu, &mut rng, &zeros[..kv_n], 4)?;
        let dv = upload_at(&gpu, &mut rng, &zeros[..kv_n], 6)?;
        super::backward_f16(
            &gpu,
            &dims,
            [
                dq.slice(2, n64)?,
                dk.slice(4, kv64)?,
                dv.slice(6, kv64)?,
                delta.slice(1, s64)?,
            ],
            [qh, kh, vh, oh],
            [lse.slice(7, s64)?, g.slice(2, n64)?],
        )?;
        // delta = rowsum(dO * O) reads the rounded o: within f16 rounding of o's.
        assert_close(&name("dq"), &read(&gpu, &dq, 2, n)?, &want_dq, 2e-3, 2e-3);
        assert_close(&name("dk"), &read(&gpu, &dk, 4, kv_n)?, &want_dk, 2e-3, 2e-3);
        assert_close(&name("dv"), &read(&gpu, &dv, 6, kv_n)?, &want_dv, 1e-5, 1e-4);
    }
    Ok(())
}

/// A head dimension past the shader's rows and a sequence past lavapipe's loop limit are
/// refused with the figures, never run truncated.
#[test]
fn refuses_a_head_past_128_and_a_time_past_the_loop_limit() -> Result<()> {
    let gpu = gpu();
    let buffer = gpu.alloc_elements(1 << 20, Category::Temporary, "attention")?;
    let dims = AttentionDims {
        heads_batch: 1,
        group: 1,
        time: 4,
        head_dim: 129,
        scale: 1.0,
        dropout: 0.0,
        seed: 0,
    };
    let s = buffer.slice(0, 4 * 129)?;
    let l = buffer.slice(0, 4)?;
    let err = super::forward(&gpu, &dims, [s, l], [s, s, s]).expect_err("must be refused");
    assert!(
        matches!(err, Error::InvalidArgument { .. }) && err.to_string().contains("129"),
        "{err}"
    );
    if let Some(limit) = gpu.loop_iteration_limit() {
        let time = crate::kernels::largest_within(limit, |t| super::loop_iterations(t, 128));
        let dims = AttentionDims {
            heads_batch: 1,
            group: 1,
            time: time + 1,
            head_dim: 128,
            scale: 1.0,
            dropout: 0.0,
            seed: 0,
        };
        let s = buffer.slice(0, (time + 1) * 128)?;
        let l = buffer.slice(0, time + 1)?;
        let err = super::forward(&gpu, &dims, [s, l], [s, s, s]).expect_err("must be refused");
        assert!(matches!(err, Error::LoopLimit { .. }), "{err}");
        assert!(err.to_string().contains(&format!("time <= {time}")), "{err}");
    }
    Ok(())
}
