//! §6: `pack2x16float` / `unpack2x16float` without the `SHADER_F16` feature.

use plimsoll_kernels_wgsl::kernels::convert::reference as cpu;

use crate::{ErrorLog, pipeline, raw_device, read_back, storage_buffer, validation_error};

const PACK: &str = r"
@group(0) @binding(0) var<storage, read_write> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> words: array<u32>;
@group(0) @binding(2) var<storage, read_write> back: array<f32>;
@compute @workgroup_size(4)
fn pack(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let w = pack2x16float(vec2<f32>(src[2u * i], src[2u * i + 1u]));
    words[i] = w;
    let v = unpack2x16float(w);
    back[2u * i] = v.x;
    back[2u * i + 1u] = v.y;
}
";

/// §6: `pack2x16float` / `unpack2x16float` work on a device created with no features at all (no
/// `SHADER_F16`), put element 2i in the low half of word i, and round as the CPU reference does.
#[test]
fn pack2x16float_needs_no_shader_f16_feature() {
    let log = ErrorLog::default();
    let raw = raw_device(wgpu::Features::empty(), Some(&log));
    assert!(!raw.device.features().contains(wgpu::Features::SHADER_F16));
    // Normal halves only: out-of-range values are indeterminate in WGSL and subnormals may flush.
    let input = [
        1.0f32,
        -2.5,
        0.1,
        65504.0,
        -0.0,
        std::f32::consts::PI,
        0.5,
        1e-3,
    ];
    let (src, words, back) = (
        storage_buffer(&raw.device, "src", 32),
        storage_buffer(&raw.device, "words", 16),
        storage_buffer(&raw.device, "back", 32),
    );
    raw.queue
        .write_buffer(&src, 0, bytemuck::cast_slice(&input));
    let (_, error) = validation_error(&raw.device, || {
        let pipe = pipeline(&raw.device, PACK, "pack");
        let entries: Vec<wgpu::BindGroupEntry> = [&src, &words, &back]
            .iter()
            .zip(0u32..)
            .map(|(b, binding)| wgpu::BindGroupEntry {
                binding,
                resource: b.as_entire_binding(),
            })
            .collect();
        let group = raw.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipe.get_bind_group_layout(0),
            entries: &entries,
        });
        raw.submit_one_workgroup(&pipe, &group)
    });
    assert!(error.is_none(), "{error:?}");
    let got_words: Vec<u32> = bytemuck::pod_collect_to_vec(&read_back(&raw, &words, 0, 16));
    assert_eq!(
        got_words[0], 0xc100_3c00,
        "[1.0, -2.5]: element 0 in the low half"
    );
    assert_eq!(got_words[1] & 0xffff, 0x2e66, "0.1 rounds to nearest");
    assert_eq!(got_words, cpu::pack_f16(&input));
    let got_back: Vec<f32> = bytemuck::pod_collect_to_vec(&read_back(&raw, &back, 0, 32));
    let want = cpu::round_to_f16(&input);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got_back), bits(&want), "{got_back:?} vs {want:?}");
    assert!(log.lock().unwrap().is_empty(), "{:?}", log.lock().unwrap());
}
