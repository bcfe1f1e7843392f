//! Per-phase peaks and the trace's step/phase stamps, against a naive model: random allocations,
//! frees, phase changes, peak resets and cache releases; after every action the allocator's
//! per-phase peaks (allocated, reserved, per category) and the peaks since creation (which resets
//! leave alone) must equal the model's, which it computes from the allocations' sizes and from
//! replaying the trace's segment events.
#![allow(clippy::unwrap_used)]

use plimsoll_allocator::{
    Allocation, AllocatorConfig, BufferAllocator, Category, Phase, PhaseStats, Request,
    SimulatedSource, TraceEventKind,
};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Action {
    Allocate { size: u64, category: usize },
    Free { pick: usize },
    Phase { phase: usize },
    ResetPeaks,
    EmptyCache,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        8 => (1u64..40_000, 0usize..7).prop_map(|(size, category)| Action::Allocate { size, category }),
        6 => any::<usize>().prop_map(|pick| Action::Free { pick }),
        3 => (0usize..5).prop_map(|phase| Action::Phase { phase }),
        1 => Just(Action::ResetPeaks),
        1 => Just(Action::EmptyCache),
    ]
}

#[derive(Default)]
struct Model {
    phase: usize,
    step: u64,
    allocated: u64,
    reserved: u64,
    categories: [u64; 7],
    phases: [PhaseStats; 5],
    /// Peaks never reset: allocated, reserved and per category.
    lifetime: (u64, u64, [u64; 7]),
}

impl Model {
    fn touch(&mut self) {
        let p = &mut self.phases[self.phase];
        p.peak_allocated_bytes = p.peak_allocated_bytes.max(self.allocated);
        p.peak_reserved_bytes = p.peak_reserved_bytes.max(self.reserved);
        for (peak, &now) in p.peak_category_bytes.iter_mut().zip(&self.categories) {
            *peak = (*peak).max(now);
        }
        let (allocated, reserved, categories) = &mut self.lifetime;
        *allocated = (*allocated).max(self.allocated);
        *reserved = (*reserved).max(self.reserved);
        for (peak, &now) in categories.iter_mut().zip(&self.categories) {
            *peak = (*peak).max(now);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn phase_peaks_and_trace_stamps_match_a_naive_model(actions in proptest::collection::vec(action(), 1..200)) {
        let config = AllocatorConfig {
            budget_bytes: u64::MAX,
            max_segment_bytes: 64 * 1024,
            small_segment_bytes: 16 * 1024,
            small_request_max_bytes: 4 * 1024,
            granule_bytes: 256,
        };
        let mut allocator = BufferAllocator::new(SimulatedSource::unlimited(), config);
        allocator.set_trace_capacity(1 << 20);
        let mut model = Model::default();
        let mut live: Vec<Allocation> = Vec::new();
        let mut replayed = 0usize;
        for action in actions {
            match action {
                Action::Allocate { size, category } => {
                    let category = Category::ALL[category];
                    let a = allocator.allocate(Request::new(size, category, "x")).unwrap();
                    model.allocated += a.size_bytes();
                    model.categories[category.index()] += a.size_bytes();
                    live.push(a);
                }
                Action::Free { pick } => {
                    if !live.is_empty() {
                        let a = live.swap_remove(pick % live.len());
                        model.allocated -= a.size_bytes();
                        model.categories[a.category().index()] -= a.size_bytes();
                        allocator.free(a).unwrap();
                    }
                }
                Action::Phase { phase } => {
                    model.step += 1;
                    model.phase = phase;
                    allocator.set_phase(model.step, Phase::ALL[phase]);
                }
                Action::ResetPeaks => {
                    model.phases = Default::default();
                    allocator.reset_peaks();
                }
                Action::EmptyCache => {
                    allocator.empty_cache();
                }
            }
            // Replay the new trace events: segment events change reserved bytes, in order.
            let trace = allocator.trace();
            let mut last_time = 0;
            for event in trace.events.iter().skip(replayed) {
                prop_assert_eq!(event.step, model.step);
                prop_assert_eq!(event.phase, Phase::ALL[model.phase]);
                prop_assert!(event.time_ns >= last_time);
                last_time = event.time_ns;
                match event.kind {
                    TraceEventKind::SegmentCreate => {
                        model.reserved += event.size_bytes;
                        model.touch();
                    }
                    TraceEventKind::SegmentRelease => model.reserved -= event.size_bytes,
                    _ => {}
                }
            }
            replayed = trace.events.len();
            model.touch();
            let stats = allocator.stats();
            prop_assert_eq!(stats.phase, Phase::ALL[model.phase]);
            prop_assert_eq!(stats.reserved_bytes, model.reserved);
            prop_assert_eq!(stats.phases, model.phases);
            // The peaks since creation survive every reset (a run's summary shows them).
            let (allocated, reserved, categories) = model.lifetime;
            prop_assert_eq!(stats.lifetime.allocated_bytes, allocated);
            prop_assert_eq!(stats.lifetime.reserved_bytes, reserved);
            prop_assert_eq!(stats.lifetime.category_allocated_bytes, categories);
            prop_assert!(allocator.summary().to_string().contains(&plimsoll_allocator::format_bytes(allocated)));
        }
    }
}
