//! `plan`'s unit tests: how `--offload auto` goes down the levels.

use super::*;

/// A refusal naming `need` bytes.
fn refused(need: u64) -> Error {
    Error::BudgetTooSmall {
        budget_bytes: 100,
        predicted_bytes: need,
        fixed_bytes: 10,
        f16_fits: None,
    }
}

/// `auto` goes down the levels only as far as needed, and within the host budget: each
/// level's plan is a stand-in that fits from `fits_from` on, holding `host` bytes there.
#[test]
fn auto_offloads_the_least_that_fits_within_the_host_budget() {
    let levels = [
        Offload::None,
        Offload::OptimizerState,
        Offload::Activations,
        Offload::Parameters,
    ];
    let run = |fits_from: usize, host: u64, host_budget: u64| {
        let config = TrainConfig {
            offload: Offload::Auto,
            host_memory_budget: Some(host_budget),
            ..TrainConfig::default()
        };
        with_offload(&config, |c| {
            let level = levels.iter().position(|&l| l == c.offload).unwrap_or(9);
            match level >= fits_from {
                true => Ok(MemoryPlan {
                    offload: c.offload.to_string(),
                    offload_activation_bytes: host,
                    ..MemoryPlan::default()
                }),
                // Each level's refusal names a smaller need.
                false => Err(refused(1000 - level as u64)),
            }
        })
    };
    for (fits_from, want) in [
        (0, "none"),
        (1, "optimizer"),
        (2, "activations"),
        (3, "parameters"),
    ] {
        let plan = run(fits_from, 5, 1 << 20).expect("a level fits");
        assert_eq!(plan.offload, want);
    }
    // Nothing fits: the last level's refusal (the smallest need).
    match run(4, 5, 1 << 20) {
        Err(Error::BudgetTooSmall {
            predicted_bytes, ..
        }) => assert_eq!(predicted_bytes, 997),
        other => panic!("{other:?}"),
    }
    // The fitting level passes the host budget: the refusal before it stands.
    match run(2, 1 << 30, 1 << 20) {
        Err(Error::BudgetTooSmall {
            predicted_bytes, ..
        }) => assert_eq!(predicted_bytes, 999),
        other => panic!("{other:?}"),
    }
    // An explicit level is planned as it is.
    let config = TrainConfig {
        offload: Offload::Activations,
        ..TrainConfig::default()
    };
    let plan = with_offload(&config, |c| {
        Ok(MemoryPlan {
            offload: c.offload.to_string(),
            ..MemoryPlan::default()
        })
    });
    assert_eq!(plan.expect("planned as asked").offload, "activations");
}
