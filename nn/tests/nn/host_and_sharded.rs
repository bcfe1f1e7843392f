//! AdamW off the device: `HostAdamW` (its state and update in host memory) against the device's
//! AdamW, and `ShardedAdamW` (one rank's rows) whose ranks together make AdamW's step.

use plimsoll_autograd::{Gpu, Tensor};
use plimsoll_kernels_wgsl::testing::{assert_close, gpu};
use plimsoll_nn::{AdamW, AdamWConfig, Optimizer};

use crate::common::{param, set_grad};

/// HostAdamW keeps AdamW's moments in host memory and updates on the host: over five steps of
/// random gradients (a matrix that decays, a vector that does not, a gradient scale, a learning
/// rate that changes) its parameters follow the device's AdamW within f32 rounding, the device
/// holds none of its state, and its host state (AdamW's names and shapes) loaded into a device
/// AdamW carries on as that optimizer would.
#[test]
fn host_adamw_follows_the_device_adamw() {
    use plimsoll_kernels_wgsl::testing::Rng;
    use plimsoll_nn::HostAdamW;
    let gpu = gpu();
    let mut rng = Rng::new(17);
    let shapes: [&[usize]; 2] = [&[3, 5], &[5]];
    let start: Vec<Vec<f32>> = shapes
        .iter()
        .map(|s| rng.vec_f32(s.iter().product(), -1.0, 1.0))
        .collect();
    let make = |tag: &str| -> Vec<(String, Tensor)> {
        shapes
            .iter()
            .zip(&start)
            .enumerate()
            .map(|(i, (s, v))| (format!("p{i}"), param(&gpu, v, s, tag)))
            .collect()
    };
    let (device_params, host_params) = (make("device"), make("host"));
    // A large eps, so that the gradient's scale shows in the update (Adam's m / sqrt(v) alone
    // would cancel it).
    let config = AdamWConfig {
        lr: 0.05,
        weight_decay: 0.1,
        decay_matrices_only: true,
        eps: 0.1,
        ..AdamWConfig::default()
    };
    let mut device = AdamW::new(config);
    let mut host = device.offloaded().expect("AdamW has a host form");
    for step in 0..5 {
        for ((_, d), (_, h)) in device_params.iter().zip(&host_params) {
            let g = rng.vec_f32(d.numel(), -2.0, 2.0);
            set_grad(&gpu, d, &g);
            set_grad(&gpu, h, &g);
        }
        let lr = 0.05 / (step + 1) as f32;
        for opt in [&mut device as &mut dyn Optimizer, host.as_mut()] {
            opt.set_lr(lr);
            opt.set_grad_scale(0.5);
        }
        device.step(&device_params).unwrap();
        host.step(&host_params).unwrap();
    }
    for ((name, d), (_, h)) in device_params.iter().zip(&host_params) {
        let want: Vec<f64> = d.to_vec().unwrap().iter().map(|&v| f64::from(v)).collect();
        assert_close(name, &h.to_vec().unwrap(), &want, 1e-6, 1e-5);
    }
    assert!(host.state().is_empty(), "nothing on the device");
    assert_eq!(host.step_count(), 5);
    let saved = host.host_state().expect("host state");
    let names: Vec<&str> = saved.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["exp_avg.p0", "exp_avg.p1", "exp_avg_sq.p0", "exp_avg_sq.p1"]
    );
    assert_eq!(saved[0].1.shape, [3, 5]);
    // The host state on the device: a device AdamW goes on from it as the host one does.
    let uploaded: Vec<(String, Tensor)> = saved
        .iter()
        .map(|(n, t)| {
            (
                n.clone(),
                Tensor::from_slice(&gpu, &t.data, &t.shape).unwrap(),
            )
        })
        .collect();
    let mut resumed = AdamW::new(config);
    resumed.load_state(uploaded, 5).unwrap();
    let again = HostAdamW::new(config);
    assert_eq!(again.host_bytes(), 0);
    for ((_, d), (_, h)) in device_params.iter().zip(&host_params) {
        let g = rng.vec_f32(d.numel(), -2.0, 2.0);
        d.write_from_slice(&h.to_vec().unwrap()).unwrap();
        set_grad(&gpu, d, &g);
        set_grad(&gpu, h, &g);
    }
    for opt in [&mut resumed as &mut dyn Optimizer, host.as_mut()] {
        opt.set_lr(0.01);
        opt.set_grad_scale(1.0);
    }
    resumed.step(&device_params).unwrap();
    host.step(&host_params).unwrap();
    for ((name, d), (_, h)) in device_params.iter().zip(&host_params) {
        let want: Vec<f64> = d.to_vec().unwrap().iter().map(|&v| f64::from(v)).collect();
        assert_close(name, &h.to_vec().unwrap(), &want, 1e-6, 1e-5);
    }
}

/// RowShard cuts the flattened parameters at row boundaries into contiguous parts that cover
/// every row once, in rank order, each within the longest row of an equal share.
#[test]
fn row_shards_cover_every_row_once_in_nearly_equal_parts() {
    use plimsoll_nn::RowShard;
    let shapes: Vec<(String, Vec<usize>)> = [&[7usize, 3][..], &[3], &[], &[11, 2, 2], &[1]]
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("p{i}"), s.to_vec()))
        .collect();
    let total: usize = shapes
        .iter()
        .map(|(_, s)| s.iter().product::<usize>())
        .sum();
    for ranks in 1..=6 {
        let shards = RowShard::all(&shapes, ranks);
        let mut next = 0;
        for (r, shard) in shards.iter().enumerate() {
            assert_eq!(shard.rank(), r);
            let flat = shard.flat();
            assert_eq!(
                flat.start, next,
                "{ranks} ranks: rank {r} starts where {} ended",
                r
            );
            next = flat.end;
            // An equal share, within the longest row (4 elements) at either end.
            let share = total as f64 / ranks as f64;
            assert!(
                (flat.len() as f64 - share).abs() <= 8.0,
                "{ranks}: {flat:?}"
            );
        }
        assert_eq!(next, total);
        for (i, (name, shape)) in shapes.iter().enumerate() {
            let rows = shape.first().copied().unwrap_or(1);
            let mut covered = 0;
            for shard in &shards {
                let r = shard.rows(name).unwrap();
                assert_eq!(r.start, covered, "{name} on {ranks} ranks");
                covered = r.end;
                assert_eq!(shard.parts()[i].0, *name);
            }
            assert_eq!(covered, rows, "{name} on {ranks} ranks");
        }
    }
}

/// ShardedAdamW over each rank's rows makes AdamW's step: over four steps of random gradients
/// (a matrix that decays, vectors and a 0-d tensor that do not, a gradient scale) each rank's
/// rows equal the device AdamW's bit for bit, the rows it does not keep are untouched, and its
/// state is those rows alone. Then a whole AdamW state loads into each rank's optimizer, which
/// goes on as AdamW does, also from gradients given as rows (stage 2).
#[test]
fn sharded_adamw_ranks_together_make_adamws_step() {
    use plimsoll_kernels_wgsl::testing::Rng;
    use plimsoll_nn::{RowShard, row_view};
    use std::collections::BTreeMap;
    let gpu = gpu();
    let mut rng = Rng::new(29);
    let shapes: Vec<(String, Vec<usize>)> = [&[6usize, 5][..], &[5], &[], &[4, 3]]
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("p{i}"), s.to_vec()))
        .collect();
    let start: Vec<Vec<f32>> = shapes
        .iter()
        .map(|(_, s)| rng.vec_f32(s.iter().product(), -1.0, 1.0))
        .collect();
    let grads: Vec<Vec<Vec<f32>>> = (0..5)
        .map(|_| {
            start
                .iter()
                .map(|v| rng.vec_f32(v.len(), -2.0, 2.0))
                .collect()
        })
        .collect();
    let make = |tag: &str| -> Vec<(String, Tensor)> {
        shapes
            .iter()
            .zip(&start)
            .map(|((name, s), v)| (name.clone(), param(&gpu, v, s, tag)))
            .collect()
    };
    let config = AdamWConfig {
        lr: 0.05,
        weight_decay: 0.1,
        decay_matrices_only: true,
        eps: 0.1,
        ..AdamWConfig::default()
    };
    let grad_of = |p: &Tensor, g: &[f32]| {
        p.clear_grad();
        p.set_grad_from_slice(g).unwrap();
    };
    let whole = make("whole");
    let mut adamw = AdamW::new(config);
    for g in &grads[..4] {
        for ((_, p), g) in whole.iter().zip(g) {
            grad_of(p, g);
        }
        adamw.set_grad_scale(0.5);
        adamw.step(&whole).unwrap();
    }
    let want: Vec<Vec<f32>> = whole.iter().map(|(_, p)| p.to_vec().unwrap()).collect();
    let total: usize = start.iter().map(Vec::len).sum();
    for ranks in [1, 2, 3] {
        let mut state_elements = 0;
        for rank in 0..ranks {
            let shard = RowShard::new(&shapes, rank, ranks);
            let params = make("rank");
            let mut opt = adamw_like(&adamw, &gpu, shard.clone());
            for g in &grads[..4] {
                for ((_, p), g) in params.iter().zip(g) {
                    grad_of(p, g);
                }
                opt.set_grad_scale(0.5);
                opt.step(&params).unwrap();
            }
            for (((name, shape, rows), (_, p)), (w, s)) in shard
                .parts()
                .iter()
                .zip(&params)
                .zip(want.iter().zip(&start))
            {
                let row_len: usize = shape.iter().skip(1).product();
                let got = p.to_vec().unwrap();
                let (a, b) = (rows.start * row_len, rows.end * row_len);
                assert_eq!(
                    got[a..b],
                    w[a..b],
                    "{name}'s rows {rows:?} on rank {rank}/{ranks}"
                );
                assert_eq!(got[..a], s[..a], "{name} before rank {rank}'s rows");
                assert_eq!(got[b..], s[b..], "{name} after rank {rank}'s rows");
            }
            let state = opt.state();
            state_elements += state.iter().map(|(_, t)| t.numel()).sum::<usize>();
            assert_eq!(opt.row_shard(), Some(&shard));
        }
        assert_eq!(
            state_elements,
            2 * total,
            "{ranks} ranks keep the state once"
        );
    }
    // A whole state (AdamW's) loads as each rank's rows; a fifth step, from row gradients.
    let host_state: Vec<(String, plimsoll_nn::state::HostTensor)> = adamw
        .state()
        .iter()
        .map(|(n, t)| {
            let values = t.to_vec().unwrap();
            (
                n.clone(),
                plimsoll_nn::state::HostTensor::new(t.shape().to_vec(), values),
            )
        })
        .collect();
    for ((_, p), g) in whole.iter().zip(&grads[4]) {
        grad_of(p, g);
    }
    adamw.set_grad_scale(1.0);
    adamw.step(&whole).unwrap();
    for rank in 0..2 {
        let shard = RowShard::new(&shapes, rank, 2);
        let params = make("resumed");
        for ((_, p), w) in params.iter().zip(&want) {
            p.write_from_slice(w).unwrap();
        }
        let mut opt = adamw_like(&adamw, &gpu, shard.clone());
        assert!(opt.loads_from_host());
        assert!(opt.load_host_state(host_state.clone(), 4).unwrap());
        let mut rows = BTreeMap::new();
        for (((name, shape, r), (_, p)), g) in shard.parts().iter().zip(&params).zip(&grads[4]) {
            if r.is_empty() {
                continue;
            }
            let row_len: usize = shape.iter().skip(1).product();
            let rows_shape = shard.row_shape(name).unwrap();
            let part = &g[r.start * row_len..r.end * row_len];
            rows.insert(
                name.clone(),
                Tensor::from_slice(&gpu, part, &rows_shape).unwrap(),
            );
            // The parameter's own gradient is not what the step reads.
            grad_of(p, &vec![100.0; p.numel()]);
        }
        opt.set_row_gradients(rows).unwrap();
        opt.step(&params).unwrap();
        for ((name, _, r), ((_, p), (_, w))) in shard.parts().iter().zip(params.iter().zip(&whole))
        {
            let (got, w) = (row_view(p, r).unwrap(), row_view(w, r).unwrap());
            assert_eq!(
                got.to_vec().unwrap(),
                w.to_vec().unwrap(),
                "{name} after the load"
            );
        }
    }
}

/// `adamw`'s configuration over `shard` (the trait's constructor).
fn adamw_like(adamw: &AdamW, gpu: &Gpu, shard: plimsoll_nn::RowShard) -> Box<dyn Optimizer> {
    let mut opt = adamw.sharded(gpu, shard).expect("AdamW has a sharded form");
    opt.set_lr(adamw.lr());
    opt
}
