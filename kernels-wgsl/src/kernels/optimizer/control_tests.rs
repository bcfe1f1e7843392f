//! The step decided on the device: `step_control` against [`reference::step_control`] (the
//! same f32 operations in the same order, so every word bit for bit), and the updates recorded
//! with a control vector against the same updates given the scale on the host (equal bits), or
//! nothing written when the control says skip.

use super::reference;
use super::{AdamWConfig, AdamWStep, AdamWTensor, ControlInputs, SgdConfig, SgdStep};
use crate::kernels::TensorLaunches;
use crate::testing::{DEADLINE, Rng, gpu_and_rng};
use crate::{Category, DeviceBuffer, Gpu, Result};

/// The read-back tensor's layout: `[loss, partials..., flag, first index]`.
fn sums_with_flag(gpu: &Gpu, partials: &[f32], flagged: bool) -> Result<DeviceBuffer> {
    let mut values = vec![2.5f32];
    values.extend_from_slice(partials);
    values.push(f32::from_bits(u32::from(flagged)));
    values.push(f32::from_bits(u32::MAX));
    gpu.upload(&values, Category::Temporary, "sums")
}

#[test]
fn step_control_matches_the_reference_bit_for_bit() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(71);
    let cases = [
        // (partials, flagged, halted, max_norm, loss_scale)
        (1usize, false, false, None, 1.0f32),
        (300, false, false, Some(0.5), 1.0),
        (5000, false, false, Some(1e6), 1.0),
        (5000, false, false, Some(3.0), 1024.0),
        (257, true, false, Some(1.0), 1.0),
        (64, false, true, None, 1.0),
    ];
    for (n, flagged, halted, max_norm, loss_scale) in cases {
        let partials = rng.vec_f32(n, 0.0, 0.5);
        let sums = sums_with_flag(&gpu, &partials, flagged)?;
        let control = gpu.upload(
            &[7.0f32, 7.0, f32::from(u8::from(halted)), 7.0],
            Category::Temporary,
            "control",
        )?;
        let inputs = ControlInputs {
            max_norm,
            loss_scale,
        };
        let whole = sums.whole();
        super::step_control(
            &gpu,
            &inputs,
            whole.slice(1, n as u64)?,
            whole.slice(1 + n as u64, 1)?,
            control.whole(),
        )?;
        let got: Vec<f32> = gpu.read_all(&control, DEADLINE)?;
        let want = reference::step_control(&partials, flagged, halted, &inputs);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&got),
            bits(&want),
            "n {n} flagged {flagged} halted {halted} max {max_norm:?} scale {loss_scale}: \
             {got:?} vs {want:?}"
        );
        let sum: f64 = partials.iter().map(|&x| f64::from(x)).sum();
        let norm = sum.sqrt() / f64::from(loss_scale);
        assert!(
            (f64::from(got[3]) - norm).abs() <= 1e-5 * norm,
            "the norm {} vs {norm} summed in f64",
            got[3]
        );
        let skip = flagged || halted;
        assert_eq!(got[1] != 0.0, skip, "skip");
        let clipped = max_norm.is_some_and(|m| norm > f64::from(m));
        assert_eq!(got[0] < 1.0 / loss_scale, clipped, "clipped: {}", got[0]);
    }
    Ok(())
}

#[test]
fn a_nonfinite_sum_skips_and_halts_even_without_the_flag() -> Result<()> {
    let (gpu, _) = gpu_and_rng(72);
    let sums = sums_with_flag(&gpu, &[1.0, f32::INFINITY, 2.0], false)?;
    let control = gpu.upload(&[0.0f32; 4], Category::Temporary, "control")?;
    let whole = sums.whole();
    let inputs = ControlInputs {
        max_norm: Some(1.0),
        loss_scale: 1.0,
    };
    super::step_control(&gpu, &inputs, whole.slice(1, 3)?, whole.slice(4, 1)?, control.whole())?;
    let got: Vec<f32> = gpu.read_all(&control, DEADLINE)?;
    assert_eq!((got[1], got[2]), (1.0, 1.0), "skipped and halted: {got:?}");
    Ok(())
}

/// Four tensors' operands and their host copies.
struct Case {
    host: Vec<[Vec<f32>; 4]>,
    device: Vec<[DeviceBuffer; 4]>,
}

impl Case {
    fn new(gpu: &Gpu, rng: &mut Rng, lens: &[usize]) -> Result<Case> {
        let mut host = Vec::new();
        let mut device = Vec::new();
        for &len in lens {
            let values = [
                rng.vec_f32(len, -1.0, 1.0),
                rng.vec_f32(len, -1.0, 1.0),
                rng.vec_f32(len, -0.1, 0.1),
                rng.vec_f32(len, 0.0, 0.01),
            ];
            let up = |v: &Vec<f32>| gpu.upload(v, Category::Temporary, "operand");
            device.push([
                up(&values[0])?,
                up(&values[1])?,
                up(&values[2])?,
                up(&values[3])?,
            ]);
            host.push(values);
        }
        Ok(Case { host, device })
    }

    fn tensors(&self) -> Vec<AdamWTensor<'_>> {
        self.device
            .iter()
            .enumerate()
            .map(|(i, [p, g, m, v])| AdamWTensor {
                param: p.whole(),
                grad: g.whole(),
                exp_avg: m.whole(),
                exp_avg_sq: v.whole(),
                decays: i % 2 == 0,
            })
            .collect()
    }

    /// Every operand's bits, in order.
    fn bits(&self, gpu: &Gpu) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        for operands in &self.device {
            for b in operands {
                let values: Vec<f32> = gpu.read_all(b, DEADLINE)?;
                out.extend(values.iter().map(|x| x.to_bits()));
            }
        }
        Ok(out)
    }

    fn host_bits(&self) -> Vec<u32> {
        self.host
            .iter()
            .flat_map(|ops| ops.iter().flatten().map(|x| x.to_bits()))
            .collect()
    }
}

#[test]
fn a_controlled_update_is_the_host_scaled_one_or_none() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(73);
    let config = AdamWConfig {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let lens = [1usize, 255, 1000, 4099];
    let scale = 0.37f32;
    for launches in [TensorLaunches::OnePerTensor, TensorLaunches::Multi] {
        for skip in [false, true] {
            let controlled = Case::new(&gpu, &mut Rng::new(9), &lens)?;
            let host_scaled = Case::new(&gpu, &mut Rng::new(9), &lens)?;
            let control = gpu.upload(
                &[scale, f32::from(u8::from(skip)), 0.0, 1.0],
                Category::Temporary,
                "control",
            )?;
            let step = |control| AdamWStep {
                config,
                step: 3,
                grad_scale: match control {
                    // A scale the controlled launch must not use.
                    Some(_) => 1e9,
                    None => scale,
                },
                control,
            };
            super::adamw_steps_in(
                &gpu,
                launches,
                &step(Some(control.whole())),
                &controlled.tensors(),
            )?;
            super::adamw_steps_in(&gpu, launches, &step(None), &host_scaled.tensors())?;
            let what = format!("{launches:?}, skip {skip}");
            match skip {
                false => assert_eq!(
                    controlled.bits(&gpu)?,
                    host_scaled.bits(&gpu)?,
                    "{what}: the update with the scale on the host"
                ),
                true => assert_eq!(
                    controlled.bits(&gpu)?,
                    controlled.host_bits(),
                    "{what}: nothing written"
                ),
            }
        }
    }
    // SGD with momentum, one tensor.
    let len = 1001;
    for skip in [false, true] {
        let sgd = SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            dampening: 0.0,
            weight_decay: 0.01,
            nesterov: true,
        };
        let [p, g, buf] = [0, 1, 2].map(|_| rng.vec_f32(len, -1.0, 1.0));
        let up = |v: &Vec<f32>| gpu.upload(v, Category::Temporary, "sgd operand");
        let run = |control: Option<&DeviceBuffer>| -> Result<Vec<f32>> {
            let (pd, gd, bd) = (up(&p)?, up(&g)?, up(&buf)?);
            let step = SgdStep {
                config: sgd,
                first_step: false,
                grad_scale: if control.is_some() { 1e9 } else { scale },
                control: control.map(DeviceBuffer::whole),
            };
            super::sgd_step(&gpu, &step, pd.whole(), gd.whole(), Some(bd.whole()))?;
            let mut out: Vec<f32> = gpu.read_all(&pd, DEADLINE)?;
            out.extend(gpu.read_all::<f32>(&bd, DEADLINE)?);
            Ok(out)
        };
        let control = gpu.upload(
            &[scale, f32::from(u8::from(skip)), 0.0, 1.0],
            Category::Temporary,
            "control",
        )?;
        let got = run(Some(&control))?;
        let want = match skip {
            false => run(None)?,
            true => p.iter().chain(&buf).copied().collect(),
        };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "sgd, skip {skip}");
    }
    Ok(())
}
