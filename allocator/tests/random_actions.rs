//! Replays random action lists, runs the invariant checkers (blocks, and the live handles) after
//! every action, and compares with a naive model: whenever the model finds room (a gap in a live
//! segment, or a budget that allows a new segment once empty segments are released) the allocator
//! must find room too.
//! 256 cases x 400..=440 actions: over 100,000 actions per run.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use plimsoll_allocator::{
    AllocError, Allocation, AllocatorConfig, BufferAllocator, Category, Request, SegmentId,
    SimulatedSource,
};
use proptest::prelude::*;

const GRANULE: u64 = 256;
const MAX_SEGMENT: u64 = 64 * 1024;

#[derive(Clone, Debug)]
enum Action {
    /// Size `1 + raw % 2^bits` (roughly log-uniform up to 64 KiB), alignment `2^alignment_log2`.
    Allocate {
        bits: u32,
        raw: u64,
        alignment_log2: u32,
        category: usize,
    },
    /// Frees the live allocation at `pick % live`.
    Free {
        pick: usize,
    },
    EmptyCache,
    /// Budget of `kib` KiB, or none.
    SetBudget {
        kib: Option<u64>,
    },
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        10 => (0u32..=16, any::<u64>(), 0u32..=13, 0usize..7).prop_map(
            |(bits, raw, alignment_log2, category)| Action::Allocate { bits, raw, alignment_log2, category }
        ),
        8 => any::<usize>().prop_map(|pick| Action::Free { pick }),
        1 => Just(Action::EmptyCache),
        1 => proptest::option::weighted(0.7, 64u64..512).prop_map(|kib| Action::SetBudget { kib }),
    ]
}

fn config() -> AllocatorConfig {
    AllocatorConfig {
        budget_bytes: u64::MAX,
        max_segment_bytes: MAX_SEGMENT,
        small_segment_bytes: 16 * 1024,
        small_request_max_bytes: 4 * 1024,
        granule_bytes: GRANULE,
    }
}

/// The naive model: the used intervals of every segment, as a list.
#[derive(Default)]
struct Model {
    used: BTreeMap<SegmentId, Vec<(u64, u64)>>,
}

impl Model {
    /// Whether a request of `size` (rounded) at `alignment` has room: a gap in a live segment, or
    /// a budget that allows a segment of `size` once every empty segment is released.
    fn has_room(
        &self,
        live: &BTreeMap<SegmentId, u64>,
        size: u64,
        alignment: u64,
        budget: u64,
    ) -> bool {
        let mut busy_reserved = 0;
        for (id, &segment_bytes) in live {
            let mut intervals = self.used.get(id).cloned().unwrap_or_default();
            if !intervals.is_empty() {
                busy_reserved += segment_bytes;
            }
            intervals.sort_unstable();
            let mut start = 0u64;
            for (offset, bytes) in intervals.into_iter().chain([(segment_bytes, 0)]) {
                if start.next_multiple_of(alignment) + size <= offset {
                    return true;
                }
                start = offset + bytes;
            }
        }
        busy_reserved + size <= budget
    }

    fn insert(&mut self, allocation: &Allocation) -> Result<(), String> {
        let intervals = self.used.entry(allocation.segment()).or_default();
        let (start, end) = (
            allocation.offset(),
            allocation.offset() + allocation.size_bytes(),
        );
        if let Some(other) = intervals
            .iter()
            .find(|(offset, bytes)| *offset < end && start < offset + bytes)
        {
            return Err(format!("{allocation:?} overlaps {other:?}"));
        }
        intervals.push((start, allocation.size_bytes()));
        Ok(())
    }

    fn remove(&mut self, allocation: &Allocation) {
        if let Some(intervals) = self.used.get_mut(&allocation.segment()) {
            intervals.retain(|&(offset, _)| offset != allocation.offset());
        }
    }
}

fn replay(actions: &[Action]) -> Result<(), String> {
    let mut allocator = BufferAllocator::new(SimulatedSource::unlimited(), config());
    let mut model = Model::default();
    let mut live: Vec<Allocation> = Vec::new();
    for (step, action) in actions.iter().enumerate() {
        let context = |message: String| format!("step {step} {action:?}: {message}");
        match *action {
            Action::Allocate {
                bits,
                raw,
                alignment_log2,
                category,
            } => {
                let size_bytes = 1 + raw % (1u64 << bits);
                let alignment = 1u64 << alignment_log2;
                let request = Request {
                    size_bytes,
                    alignment,
                    category: Category::ALL[category],
                    label: ["w", "x", "grad", "tmp"][category % 4],
                };
                let rounded = size_bytes.next_multiple_of(GRANULE);
                let room = model.has_room(
                    &allocator.source().live,
                    rounded,
                    alignment.max(GRANULE),
                    allocator.budget_bytes(),
                );
                let created = allocator.stats().segments_created;
                match allocator.allocate(request) {
                    Ok(allocation) => {
                        if allocation.offset() % alignment != 0
                            || allocation.size_bytes() < size_bytes
                        {
                            return Err(context(format!("bad placement {allocation:?}")));
                        }
                        let segment_bytes =
                            allocator.source().live.get(&allocation.segment()).copied();
                        if segment_bytes.is_none_or(|bytes| {
                            allocation.offset() + allocation.size_bytes() > bytes
                        }) {
                            return Err(context(format!("{allocation:?} outside its segment")));
                        }
                        if allocator.stats().segments_created > created
                            && allocator.stats().reserved_bytes > allocator.budget_bytes()
                        {
                            return Err(context("a new segment broke the budget".into()));
                        }
                        model.insert(&allocation).map_err(context)?;
                        live.push(allocation);
                    }
                    Err(AllocError::OutOfMemory(report)) => {
                        if room {
                            return Err(context(format!("false out-of-memory: {report}")));
                        }
                    }
                    Err(other) => return Err(context(format!("unexpected {other:?}"))),
                }
            }
            Action::Free { pick } => {
                if !live.is_empty() {
                    let allocation = live.swap_remove(pick % live.len());
                    model.remove(&allocation);
                    allocator
                        .free(allocation)
                        .map_err(|error| context(error.to_string()))?;
                }
            }
            Action::EmptyCache => {
                allocator.empty_cache();
            }
            Action::SetBudget { kib } => {
                allocator.set_budget(kib.map_or(u64::MAX, |kib| kib * 1024))
            }
        }
        allocator.check_invariants().map_err(context)?;
        allocator.check_handles(&live).map_err(context)?;
        let source = allocator.source();
        if source.live_bytes() != allocator.stats().reserved_bytes {
            return Err(context(
                "source and allocator disagree on reserved bytes".into(),
            ));
        }
        if let Some(id) = model
            .used
            .iter()
            .find(|(id, used)| !used.is_empty() && !source.live.contains_key(id))
        {
            return Err(context(format!("segment {id:?} released while in use")));
        }
    }
    // Every free merges back: with everything freed, each segment is one free block, and a whole
    // segment lands at offset 0.
    for allocation in live.drain(..) {
        allocator
            .free(allocation)
            .map_err(|error| error.to_string())?;
    }
    allocator.check_invariants()?;
    let stats = allocator.stats();
    if stats.free_blocks != stats.segments {
        return Err(format!(
            "{} free blocks in {} segments",
            stats.free_blocks, stats.segments
        ));
    }
    if let Some((_, &bytes)) = allocator.source().live.iter().next() {
        let whole = allocator
            .allocate(Request::new(bytes, Category::Other, "whole"))
            .map_err(|error| error.to_string())?;
        if whole.offset() != 0 {
            return Err(format!("whole segment at {}", whole.offset()));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_actions_keep_invariants_and_never_fail_falsely(
        actions in proptest::collection::vec(action(), 400..=440)
    ) {
        if let Err(message) = replay(&actions) {
            prop_assert!(false, "{}", message);
        }
    }
}
