//! §4: binding one buffer twice in a dispatch, and the lifetime of a dropped buffer.

use crate::{ErrorLog, pipeline, raw_device, read_back, storage_buffer, validation_error};

const HALVES: &str = r"
@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@compute @workgroup_size(64)
fn double(@builtin(global_invocation_id) gid: vec3<u32>) { dst[gid.x] = 2.0 * src[gid.x]; }
";

/// §4, pitfall 10: one buffer bound at two disjoint ranges of one dispatch, once `read` and once
/// `read_write`, is a validation error; bound `read_write` twice it is accepted and correct.
#[test]
fn one_buffer_bound_read_and_read_write_in_one_dispatch_is_a_validation_error() {
    let log = ErrorLog::default();
    let raw = raw_device(wgpu::Features::empty(), Some(&log));
    let half = 256u64; // 64 f32; a multiple of every adapter's storage offset alignment (<= 256)
    let arena = storage_buffer(&raw.device, "arena", 2 * half);
    let input: Vec<f32> = (0..64).map(|i| i as f32 - 20.5).collect();
    raw.queue
        .write_buffer(&arena, 0, bytemuck::cast_slice(&input));
    for (wgsl, expect_error) in [
        (HALVES.to_string(), true),
        (
            HALVES.replace("storage, read>", "storage, read_write>"),
            false,
        ),
    ] {
        let pipe = pipeline(&raw.device, &wgsl, "double");
        let (_, error) = validation_error(&raw.device, || {
            let range = |offset| {
                wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &arena,
                    offset,
                    size: wgpu::BufferSize::new(half),
                })
            };
            let group = raw.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &pipe.get_bind_group_layout(0),
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: range(0),
                    },
                    wgpu::BindGroupEntry {
                        binding: 1,
                        resource: range(half),
                    },
                ],
            });
            raw.submit_one_workgroup(&pipe, &group)
        });
        if expect_error {
            let message = error.map(|e| e.to_string()).unwrap_or_default();
            assert!(
                message.contains("usage"),
                "expected a usage conflict, got {message:?}"
            );
        } else {
            assert!(error.is_none(), "{error:?}");
            let got: Vec<f32> = bytemuck::pod_collect_to_vec(&read_back(&raw, &arena, half, half));
            let want: Vec<f32> = input.iter().map(|x| 2.0 * x).collect();
            assert_eq!(got, want);
        }
    }
    assert!(log.lock().unwrap().is_empty(), "{:?}", log.lock().unwrap());
}

/// §4: dropping the last handle of a buffer that recorded, unsubmitted work uses does not free
/// it under that work: the submit is valid and the work sees the buffer's data (what lets
/// `memory.rs` release a segment while the open batch still binds it).
#[test]
fn dropped_buffer_stays_alive_for_recorded_work() {
    let log = ErrorLog::default();
    let raw = raw_device(wgpu::Features::empty(), Some(&log));
    let data: Vec<u32> = (0..64).map(|i| 0x5eed_0000 ^ i).collect();
    let src = storage_buffer(&raw.device, "dropped", 256);
    let dst = storage_buffer(&raw.device, "dst", 256);
    raw.queue.write_buffer(&src, 0, bytemuck::cast_slice(&data));
    raw.queue.submit([]);
    let mut enc = raw.device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(&src, 0, &dst, 0, 256);
    drop(src);
    let (_, error) = validation_error(&raw.device, || raw.queue.submit([enc.finish()]));
    assert!(error.is_none(), "{error:?}");
    let got: Vec<u32> = bytemuck::pod_collect_to_vec(&read_back(&raw, &dst, 0, 256));
    assert_eq!(got, data);
    assert!(log.lock().unwrap().is_empty(), "{:?}", log.lock().unwrap());
}
