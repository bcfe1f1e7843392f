//! Offline placement of one training step's allocations: given every allocation's size and
//! lifetime (from a recorded step), pick each one's offset so that no two live at once share a
//! byte, using first the free ranges that segments already hold and then one new *arena* that
//! grows as needed.
//!
//! The method is greedy by size, as TensorFlow Lite's `GreedyBySizePlanner` and XLA's heap
//! simulator do: blocks are placed largest first, each into the smallest hole (between the blocks
//! already placed whose lifetimes overlap its own) that holds it, and at the arena's end when no
//! hole does. Its result is never below [`ArenaPlan::max_live`], the most bytes live at one time,
//! which no placement can beat; `cargo xtask bench plan` prints how close it comes.
//!
//! Everything counts in granules; offsets are absolute within their segment, so an alignment
//! holds for the real address.

/// "Live until the step ends" in [`Lifetime::end`].
pub const STEP_END: u32 = u32::MAX;

/// One allocation of a recorded step, in granules and event order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime {
    /// Size in granules; nonzero.
    pub size: u64,
    /// Alignment in granules; a power of two.
    pub alignment: u64,
    /// The step's event (allocation or free, counted from 0) at which it is allocated.
    pub start: u32,
    /// The event at which it is freed: it is live on `[start, end)`. [`STEP_END`] when it
    /// outlives the step.
    pub end: u32,
}

impl Lifetime {
    fn overlaps(&self, other: &Lifetime) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// A free range of an existing segment that the plan may place blocks into, in granules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// Its first granule within the segment.
    pub start: u64,
    /// Its length; nonzero.
    pub size: u64,
}

/// Where one block goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The index into the regions given to [`place`], or `None` for the new arena.
    pub region: Option<usize>,
    /// The first granule within the region's segment (or within the arena).
    pub offset: u64,
}

/// The placement of a step: one [`Placement`] per lifetime, in the order given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaPlan {
    /// Parallel to the lifetimes.
    pub placements: Vec<Placement>,
    /// The new arena's size in granules (0: the regions held everything).
    pub arena_size: u64,
    /// The most granules live at one time: a lower bound on what any placement needs.
    pub max_live: u64,
}

/// `value` rounded up to a multiple of `alignment` (a power of two).
fn align_up(value: u64, alignment: u64) -> u64 {
    (value + alignment - 1) & !(alignment - 1)
}

/// Places every lifetime (see the module documentation): the best of a few orders in which to
/// place the blocks greedily (largest first, ties to the earlier or to the later; largest area of
/// size by lifetime first; longest lifetime first; allocation order; free order; reverse
/// allocation order), each with best fit and with first fit, judged by the arena's size. Why several: no order wins
/// everywhere; on the shakespeare GPT with every block checkpointed, largest-first alone left
/// the arena 8% above the most live bytes. Deterministic: ties go to the earlier order, the
/// earlier region and the lower offset.
pub fn place(lifetimes: &[Lifetime], regions: &[Region]) -> ArenaPlan {
    let duration = |l: &Lifetime| u64::from(l.end.min(last_event(lifetimes) + 1) - l.start);
    let orders: [&dyn Fn(usize) -> (u64, u64, usize); 7] = [
        &|i| (u64::MAX - lifetimes[i].size, 0, i),
        &|i| {
            let l = &lifetimes[i];
            (u64::MAX - l.size, u64::MAX - u64::from(l.start), i)
        },
        &|i| (u64::from(lifetimes[i].end), 0, i),
        &|i| (u64::MAX - u64::from(lifetimes[i].start), 0, i),
        &|i| {
            let area = lifetimes[i].size.saturating_mul(duration(&lifetimes[i]));
            (u64::MAX - area, 0, i)
        },
        &|i| {
            let l = &lifetimes[i];
            (u64::MAX - duration(l), u64::MAX - l.size, i)
        },
        &|i| (u64::from(lifetimes[i].start), 0, i),
    ];
    let mut best: Option<ArenaPlan> = None;
    for key in orders {
        let mut order: Vec<usize> = (0..lifetimes.len()).collect();
        order.sort_by_key(|&index| key(index));
        for first_fit in [false, true] {
            let plan = place_in_order(lifetimes, regions, &order, first_fit);
            if best
                .as_ref()
                .is_none_or(|best| plan.arena_size < best.arena_size)
            {
                best = Some(plan);
            }
        }
    }
    best.unwrap_or_else(|| place_in_order(lifetimes, regions, &[], false))
}

/// The last event any lifetime starts at (0 for none).
fn last_event(lifetimes: &[Lifetime]) -> u32 {
    lifetimes.iter().map(|l| l.start).max().unwrap_or(0)
}

/// Places the blocks in `order`, each into the smallest hole that holds it, or with `first_fit`
/// the lowest.
fn place_in_order(
    lifetimes: &[Lifetime],
    regions: &[Region],
    order: &[usize],
    first_fit: bool,
) -> ArenaPlan {
    let arena = regions.len();
    // Per region (the arena last): the blocks placed there so far.
    let mut placed: Vec<Vec<usize>> = vec![Vec::new(); regions.len() + 1];
    let mut placements = vec![
        Placement {
            region: None,
            offset: 0,
        };
        lifetimes.len()
    ];
    let mut arena_size = 0u64;
    let mut conflicts: Vec<(u64, u64)> = Vec::new();
    for &index in order {
        let block = lifetimes[index];
        let alignment = block.alignment.max(1);
        // The best bounded hole so far: (hole size, region, offset).
        let mut best: Option<(u64, usize, u64)> = None;
        let mut arena_end_offset = 0;
        for (region_index, blocks) in placed.iter().enumerate() {
            let (start, end) = match regions.get(region_index) {
                Some(region) => (region.start, Some(region.start + region.size)),
                None => (0, None),
            };
            conflicts.clear();
            conflicts.extend(
                blocks
                    .iter()
                    .filter(|&&other| lifetimes[other].overlaps(&block))
                    .map(|&other| (placements[other].offset, lifetimes[other].size)),
            );
            conflicts.sort_unstable();
            let mut cursor = start;
            let consider = |hole_end: u64, cursor: u64, best: &mut Option<(u64, usize, u64)>| {
                let offset = align_up(cursor, alignment);
                if offset + block.size <= hole_end {
                    let hole = hole_end - cursor;
                    // First fit takes the first hole found (regions in order, then offsets
                    // ascending); best fit the smallest.
                    let better = match first_fit {
                        true => best.is_none(),
                        false => best.is_none_or(|(size, _, _)| hole < size),
                    };
                    if better {
                        *best = Some((hole, region_index, offset));
                    }
                }
            };
            for &(offset, size) in &conflicts {
                consider(offset, cursor, &mut best);
                cursor = cursor.max(offset + size);
            }
            match end {
                Some(end) => consider(end, cursor, &mut best),
                None => {
                    consider(arena_size, cursor, &mut best);
                    arena_end_offset = align_up(cursor, alignment);
                }
            }
        }
        let placement = match best {
            Some((_, region, offset)) => Placement {
                region: (region != arena).then_some(region),
                offset,
            },
            None => {
                arena_size = arena_size.max(arena_end_offset + block.size);
                Placement {
                    region: None,
                    offset: arena_end_offset,
                }
            }
        };
        placed[placement.region.unwrap_or(arena)].push(index);
        placements[index] = placement;
    }
    ArenaPlan {
        placements,
        arena_size,
        max_live: max_live(lifetimes),
    }
}

/// The most granules live at one time.
pub fn max_live(lifetimes: &[Lifetime]) -> u64 {
    // (time, +size or -size): frees at a time come before allocations at it (a block freed at
    // event t is gone when event t allocates, though two blocks never share an event).
    let mut events: Vec<(u32, bool, u64)> = Vec::with_capacity(lifetimes.len() * 2);
    for lifetime in lifetimes {
        events.push((lifetime.start, true, lifetime.size));
        if lifetime.end != STEP_END {
            events.push((lifetime.end, false, lifetime.size));
        }
    }
    events.sort_unstable();
    let (mut live, mut most) = (0u64, 0u64);
    for (_, allocates, size) in events {
        if allocates {
            live += size;
            most = most.max(live);
        } else {
            live -= size;
        }
    }
    most
}

/// Checks a plan against its input: every block inside its region (or the arena), aligned, and
/// no two blocks that are live at once sharing a granule. `Err` names the first violation.
///
/// # Errors
/// A description of the first violation found.
pub fn check(lifetimes: &[Lifetime], regions: &[Region], plan: &ArenaPlan) -> Result<(), String> {
    if plan.placements.len() != lifetimes.len() {
        return Err("one placement per lifetime".into());
    }
    for (index, (lifetime, placement)) in lifetimes.iter().zip(&plan.placements).enumerate() {
        let (start, end) = match placement.region {
            Some(region) => {
                let region = regions.get(region).ok_or("placement names no region")?;
                (region.start, region.start + region.size)
            }
            None => (0, plan.arena_size),
        };
        if placement.offset < start || placement.offset + lifetime.size > end {
            return Err(format!(
                "block {index} lies outside its region: {placement:?}"
            ));
        }
        if placement.offset % lifetime.alignment.max(1) != 0 {
            return Err(format!("block {index} is not aligned: {placement:?}"));
        }
        for (other, (other_lifetime, other_placement)) in lifetimes
            .iter()
            .zip(&plan.placements)
            .enumerate()
            .skip(index + 1)
        {
            let same_space = placement.region == other_placement.region
                && placement.offset < other_placement.offset + other_lifetime.size
                && other_placement.offset < placement.offset + lifetime.size;
            // Written out here rather than with `Lifetime::overlaps`, so the check does not share
            // the placer's code.
            let same_time =
                lifetime.start < other_lifetime.end && other_lifetime.start < lifetime.end;
            if same_space && same_time {
                return Err(format!(
                    "blocks {index} and {other} are live at once and overlap: \
                     {placement:?} {lifetime:?} / {other_placement:?} {other_lifetime:?}"
                ));
            }
        }
    }
    Ok(())
}
