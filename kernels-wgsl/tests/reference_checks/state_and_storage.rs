//! The non-finite check's reference (the embedding's, the optimizer's and the f16 conversion's are
//! checked in their families' `kernels::<stem>::tests`).

use super::*;

// ------------------------------------------------------------------------------ nonfinite

#[test]
fn nonfinite_flags() {
    assert_eq!(
        nonfinite::flags(&[1.0, 2.0, f32::MAX]),
        [0, nonfinite::NO_INDEX]
    );
    assert_eq!(nonfinite::flags(&[1.0, f32::INFINITY, f32::NAN]), [1, 1]);
    assert_eq!(nonfinite::flags(&[f32::NAN]), [1, 0]);
    assert_eq!(
        nonfinite::first_nonfinite(&[0.0, -0.0, f32::NEG_INFINITY]),
        Some(2)
    );
}
