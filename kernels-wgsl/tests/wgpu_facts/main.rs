//! Probes of the wgpu 30 and lavapipe behaviour the crate is built on, each named after the fact
//! in `docs/wgpu.md` it shows (section or pitfall number in the test's doc comment). They drive
//! wgpu directly, on a raw device opened on the same adapter as `testing::gpu()`, so that a change
//! in wgpu or the driver shows up here as a failed test rather than as a wrong answer in a kernel.
//! Facts that only hold on lavapipe are checked only there, and the test says so on other
//! adapters. One module per section of `docs/wgpu.md`; `blocking` holds pitfalls 2 and 4.
// Test code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bindings;
mod blocking;
mod errors;
mod f16;
mod limits;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use plimsoll_kernels_wgsl::testing::{DEADLINE, gpu};

/// Errors that reached the raw device's uncaptured-error handler.
type ErrorLog = Arc<Mutex<Vec<String>>>;

struct Raw {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    adapter_limits: wgpu::Limits,
}

/// Opens a second device on the adapter `testing::gpu()` picks, with `features` and the adapter's
/// limits; with a handler that logs uncaptured errors when `log` is given, with none otherwise.
fn raw_device(features: wgpu::Features, log: Option<&ErrorLog>) -> Raw {
    let wanted = gpu().adapter().clone();
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    let adapter = adapters
        .into_iter()
        .find(|a| {
            let i = a.get_info();
            i.name == wanted.name && i.backend == wanted.backend
        })
        .expect("the adapter testing::gpu() uses");
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("wgpu_facts"),
        required_features: features,
        required_limits: adapter.limits(),
        ..Default::default()
    }))
    .unwrap();
    if let Some(log) = log {
        let log = Arc::clone(log);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            log.lock().unwrap().push(e.to_string());
        }));
    }
    Raw {
        device,
        queue,
        info: adapter.get_info(),
        adapter_limits: adapter.limits(),
    }
}

/// Runs `f` inside a Validation scope on this thread; returns what the scope caught.
fn validation_error<T>(device: &wgpu::Device, f: impl FnOnce() -> T) -> (T, Option<wgpu::Error>) {
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let value = f();
    (value, pollster::block_on(scope.pop()))
}

fn storage_buffer(device: &wgpu::Device, label: &str, bytes: u64) -> wgpu::Buffer {
    device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: bytes,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

/// Copies `bytes` of `src` from `offset` to a staging buffer and reads them back.
fn read_back(raw: &Raw, src: &wgpu::Buffer, offset: u64, bytes: u64) -> Vec<u8> {
    let staging = raw.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("staging"),
        size: bytes,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = raw.device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(src, offset, &staging, 0, bytes);
    enc.map_buffer_on_submit(&staging, wgpu::MapMode::Read, .., |r| r.unwrap());
    let index = raw.queue.submit([enc.finish()]);
    raw.device
        .poll(wgpu::PollType::Wait {
            submission_index: Some(index),
            timeout: Some(DEADLINE),
        })
        .unwrap();
    let data = staging.slice(..).get_mapped_range().unwrap().to_vec();
    staging.unmap();
    data
}

/// A compute pipeline with the layout taken from the shader (`layout: None`).
fn pipeline(device: &wgpu::Device, wgsl: &str, entry: &str) -> wgpu::ComputePipeline {
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(entry),
        source: wgpu::ShaderSource::Wgsl(wgsl.into()),
    });
    device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(entry),
        layout: None,
        module: &module,
        entry_point: Some(entry),
        compilation_options: Default::default(),
        cache: None,
    })
}

/// Whether submission `index` has completed, without blocking.
fn is_done(raw: &Raw, index: &wgpu::SubmissionIndex) -> bool {
    let poll = raw.device.poll(wgpu::PollType::Wait {
        submission_index: Some(index.clone()),
        timeout: Some(Duration::ZERO),
    });
    match poll {
        Ok(_) => true,
        Err(wgpu::PollError::Timeout) => false,
        Err(e) => panic!("poll: {e}"),
    }
}

impl Raw {
    /// Records one workgroup of `pipe` with bind group `group` in a pass of its own and submits it.
    fn submit_one_workgroup(
        &self,
        pipe: &wgpu::ComputePipeline,
        group: &wgpu::BindGroup,
    ) -> wgpu::SubmissionIndex {
        let mut enc = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(pipe);
            pass.set_bind_group(0, group, &[]);
            pass.dispatch_workgroups(1, 1, 1);
        }
        self.queue.submit([enc.finish()])
    }
}
