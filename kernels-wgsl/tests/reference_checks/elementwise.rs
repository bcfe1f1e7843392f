//! The op families' shader codes.

use super::*;

/// The codes are the ops' positions in `ALL`, and each family's WGSL declares every op by its
/// variant's name with that code (the shaders' `case` labels).
#[test]
fn shader_codes_are_positions_in_all_and_declared_in_wgsl() {
    for (i, op) in UnaryOp::ALL.iter().enumerate() {
        assert_eq!(op.shader_code() as usize, i, "{op:?}");
        let line = format!("const {op:?}: u32 = {i}u;");
        assert!(UnaryOp::WGSL.contains(&line), "{line} in {}", UnaryOp::WGSL);
    }
    for (i, op) in BinaryOp::ALL.iter().enumerate() {
        assert_eq!(op.shader_code() as usize, i, "{op:?}");
        let line = format!("const {op:?}: u32 = {i}u;");
        assert!(
            BinaryOp::WGSL.contains(&line),
            "{line} in {}",
            BinaryOp::WGSL
        );
    }
    assert_eq!(UnaryOp::WGSL.lines().count(), UnaryOp::ALL.len());
    assert_eq!(BinaryOp::WGSL.lines().count(), BinaryOp::ALL.len());
}
