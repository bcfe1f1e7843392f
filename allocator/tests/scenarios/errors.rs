//! Misuse and out-of-memory reports.

use super::*;

#[test]
fn double_free_and_foreign_allocations_are_caught() {
    let mut allocator = new_allocator(u64::MAX);
    let mut other = new_allocator(u64::MAX);
    let a = alloc(&mut allocator, KIB);
    let guard = alloc(&mut allocator, KIB);
    let copy = a.duplicate_for_misuse_test();
    free(&mut allocator, a);
    let error = allocator.free(copy).unwrap_err();
    assert!(
        matches!(error, AllocError::UnknownAllocation { .. }),
        "{error:?}"
    );
    allocator.check_invariants().unwrap();
    // A stale handle whose block slot was reused by a new allocation is still caught.
    let reuse = alloc(&mut allocator, KIB);
    let stale = reuse.duplicate_for_misuse_test();
    free(&mut allocator, reuse);
    let reuse2 = alloc(&mut allocator, KIB);
    let stale_id = stale.id();
    let error = allocator.free(stale).unwrap_err();
    assert!(
        matches!(error, AllocError::UnknownAllocation { id } if id == stale_id),
        "{error:?}"
    );
    let foreign = alloc(&mut other, KIB);
    let error = allocator.free(foreign).unwrap_err();
    assert!(matches!(error, AllocError::UnknownAllocation { .. }));
    allocator.check_invariants().unwrap();
    finish(allocator, vec![guard, reuse2]);
}

#[test]
fn bad_requests_are_errors() {
    let mut allocator = new_allocator(u64::MAX);
    let zero = allocator.allocate(Request::new(0, Category::Other, "zero"));
    assert!(matches!(zero, Err(AllocError::ZeroSize { .. })));
    let odd = allocator.allocate(Request::new(KIB, Category::Other, "odd").with_alignment(24));
    assert!(matches!(
        odd,
        Err(AllocError::BadAlignment { alignment: 24, .. })
    ));
    let huge = allocator.allocate(Request::new(2048 * KIB, Category::Other, "huge"));
    assert!(matches!(huge, Err(AllocError::TooLarge { .. })));
    let overflow = allocator.allocate(Request::new(u64::MAX, Category::Other, "overflow"));
    assert!(matches!(overflow, Err(AllocError::TooLarge { .. })));
    allocator.check_invariants().unwrap();
    finish(allocator, vec![]);
}

#[test]
fn oom_message_never_fits() {
    let mut allocator = new_allocator(2 * SEGMENT);
    let held = alloc(&mut allocator, 4 * KIB);
    let error = allocator
        .allocate(Request::new(
            256 * KIB,
            Category::Activation,
            "linear3.forward",
        ))
        .unwrap_err();
    let message = error.to_string();
    assert!(
        message.starts_with("out of memory: asked for 256.0 KiB (activation, 'linear3.forward')"),
        "{message}"
    );
    assert!(
        message.contains("4.0 KiB allocated, 64.0 KiB reserved of a 128.0 KiB budget"),
        "{message}"
    );
    assert!(
        message.contains("can never fit the budget of 128.0 KiB"),
        "{message}"
    );
    assert!(message.contains("'test' 4.0 KiB"), "{message}");
    assert_eq!(oom(error).cause, OomCause::NeverFits);
    finish(allocator, vec![held]);
}

#[test]
fn oom_message_fragmented() {
    let mut allocator = new_allocator(SEGMENT);
    // 16 blocks of 4K fill the one segment; freeing every other one leaves 8 holes of 4K:
    // 32K free, largest 4K, fragmentation 1 - 4/32 = 0.875.
    let mut blocks: Vec<Allocation> = (0..16).map(|_| alloc(&mut allocator, 4 * KIB)).collect();
    let mut kept = Vec::new();
    for (index, block) in blocks.drain(..).enumerate() {
        if index % 2 == 0 {
            free(&mut allocator, block)
        } else {
            kept.push(block)
        }
    }
    let error = allocator
        .allocate(Request::new(8 * KIB, Category::Gradient, "w2.grad"))
        .unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("32.0 KiB allocated, 64.0 KiB reserved of a 64.0 KiB budget"),
        "{message}"
    );
    assert!(
        message.contains("fragmented: 32.0 KiB free but the largest block is 4.0 KiB"),
        "{message}"
    );
    let report = oom(error);
    assert_eq!(report.cause, OomCause::Fragmented);
    assert_eq!(report.fragmentation, 0.875);
    assert_eq!(report.top_holders, vec![("test".to_owned(), 32 * KIB)]);
    finish(allocator, kept);
}

#[test]
fn oom_message_budget_full() {
    let mut allocator = new_allocator(SEGMENT);
    let held = alloc(&mut allocator, 60 * KIB);
    let error = allocator
        .allocate(Request::new(8 * KIB, Category::Input, "batch"))
        .unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("asked for 8.0 KiB (input, 'batch')"),
        "{message}"
    );
    assert!(
        message.contains("4.0 KiB free but the largest free block is 4.0 KiB"),
        "{message}"
    );
    assert!(message.contains("budget full"), "{message}");
    assert_eq!(oom(error).cause, OomCause::BudgetFull);
    finish(allocator, vec![held]);
}
