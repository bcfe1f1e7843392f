//! The `embedding` launchers against [`reference`](super::reference) (gather and the
//! deterministic scatter-add, with repeated and out-of-range ids), their argument and loop-limit
//! checks, and the reference itself (gather and scatter-add are adjoint).

use super::reference;
use crate::kernels::largest_within;
use crate::testing::{DEADLINE, assert_exact, assert_loop_limit, dot, gpu, gpu_and_rng, gpu_and_temporaries, Guarded, largest_at_the_loop_limit, with_loop_limit, Rng, scratch, upload_u32_at};
use crate::{Category, Error, Gpu, Result};

// Tolerances. gather copies words: exact. scatter_add sums at most 129 values in [-1, 1] in f32
// in ascending token order (f64 in the reference): the bound n^2 * 2^-24 ~ 1e-3 is loose; the
// rounding errors of <= 129 partial sums of size <= ~10 add up like a random walk,
// ~sqrt(129) * 10 * 2^-24 ~ 7e-6: atol 2e-5, rtol 1e-5.
const SCATTER_TOL: (f64, f64) = (2e-5, 1e-5);

fn check_case(gpu: &Gpu, rng: &mut Rng, tokens: usize, vocab: usize, dim: usize) -> Result<()> {
    let name = |what: &str| format!("embedding {what} tokens {tokens} vocab {vocab} dim {dim}");
    let table = rng.vec_f32(vocab * dim, -3.0, 3.0);
    // Fewer ids than tokens: ids repeat, so scatter_add really sums.
    let mut ids: Vec<u32> = (0..tokens)
        .map(|_| rng.below(vocab as u64) as u32)
        .collect();
    if tokens == 37 {
        ids[4] = vocab as u32; // out of range: gathers NaN, adds nothing
    }
    let dy = rng.vec_f32(tokens * dim, -1.0, 1.0);

    let table_gpu = Guarded::upload(gpu, rng, &table, 3, "table")?;
    let ids_gpu = upload_u32_at(gpu, &ids, 2, "ids")?;
    let out_gpu = Guarded::random(gpu, rng, tokens * dim, 5, "out")?;
    let dy_gpu = Guarded::upload(gpu, rng, &dy, 1, "dy")?;
    let dtable_gpu = Guarded::random(gpu, rng, vocab * dim, 7, "dtable")?;
    let (t, v, d) = (tokens as u64, vocab as u64, dim as u64);
    let ids_s = ids_gpu.slice(2, t)?;
    super::gather(
        gpu,
        out_gpu.slice()?,
        table_gpu.slice()?,
        ids_s,
        v,
        d,
    )?;
    super::scatter_add(
        gpu,
        dtable_gpu.slice()?,
        dy_gpu.slice()?,
        ids_s,
        v,
        d,
    )?;

    let want = reference::gather(&table, &ids, vocab, dim);
    out_gpu
        .check(gpu, &name("gather"), &want, 0.0, 0.0)?;
    let want = reference::scatter_add(&ids, &dy, vocab, dim);
    let (atol, rtol) = SCATTER_TOL;
    dtable_gpu
        .check(gpu, &name("scatter_add"), &want, atol, rtol)?;
    Ok(())
}

#[test]
pub(crate) fn matches_reference() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(71);
    for tokens in [1usize, 3, 37, 129] {
        for (vocab, dim) in [(1usize, 1usize), (7, 10), (50, 33), (13, 257), (31, 1000)] {
            check_case(&gpu, &mut rng, tokens, vocab, dim)?;
        }
    }
    Ok(())
}

#[test]
fn embedding_rejects_bad_ranges() -> Result<()> {
    let (gpu, [table, out]) = gpu_and_temporaries([(40, "table"), (30, "out")])?;
    let ids = upload_u32_at(&gpu, &[0, 1, 2], 0, "ids")?;
    let (tw, iw, ow) = (table.whole(), ids.whole(), out.whole());
    super::gather(&gpu, ow, tw, iw, 4, 10)?;
    // 5 tokens of ids in a 3-element buffer: no such slice ...
    let err = ids.slice(0, 5).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("elements 0..5"), "{err}");
    // ... and 5 ids want 50 outputs, not 30.
    let ids5 = upload_u32_at(&gpu, &[0, 1, 2, 3, 0], 0, "ids5")?;
    let err = super::gather(&gpu, ow, tw, ids5.whole(), 4, 10).expect_err("must be refused");
    assert!(err.to_string().contains("out: 30 elements given"), "{err}");
    // A [5, 10] table in 40 elements.
    let err = super::gather(&gpu, ow, tw, iw, 5, 10).expect_err("must be refused");
    assert!(
        err.to_string().contains("table: 40 elements given"),
        "{err}"
    );
    // out from offset 1: 30 elements do not fit, 29 are too few.
    let err = out.slice(1, 30).expect_err("must be refused");
    assert!(
        matches!(err, Error::InvalidArgument { .. }) && err.to_string().contains("elements 1..31"),
        "{err}"
    );
    let err = super::gather(&gpu, out.slice(1, 29)?, tw, iw, 4, 10).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    // scatter_add with ids from offset 1: elements 1..4 of 3 do not fit; the 2 that do make
    // 2 tokens, whose dy is 20 elements, not 30.
    let err = ids.slice(1, 3).expect_err("must be refused");
    assert!(err.to_string().contains("elements 1..4"), "{err}");
    let ids2 = ids.slice(1, 2)?;
    let err = super::scatter_add(&gpu, tw, ow, ids2, 4, 10).expect_err("must be refused");
    assert!(err.to_string().contains("dy: 30 elements given"), "{err}");
    let err = super::scatter_add(&gpu, table.slice(0, 39)?, ow, iw, 4, 10).expect_err("must be refused");
    assert!(
        err.to_string().contains("dtable: 39 elements given"),
        "{err}"
    );
    // dim 0: empty work.
    let (t0, o0) = (table.slice(0, 0)?, out.slice(0, 0)?);
    super::scatter_add(&gpu, t0, o0, ids2, 4, 0)?;
    Ok(())
}

#[test]
fn embedding_refuses_tokens_over_the_loop_limit() -> Result<()> {
    with_loop_limit("embedding_refuses_tokens_over_the_loop_limit", |gpu, limit, tiny| {
        let largest = largest_within(limit, super::loop_iterations);
        // The token count is the ids' length: a real buffer of `largest + 1` ids; the rest are tiny
        // (the loop limit is checked before their lengths).
        let ids = scratch(gpu, largest + 1, "ids");
        let t = tiny.whole();
        assert_loop_limit(
            super::scatter_add(gpu, t, t, ids.whole(), 1, 1),
            "tokens",
            largest,
        );
        // The sort's prefix sum loops over the rows: a vocabulary past the limit is refused too.
        let one_id = ids.slice(0, 1)?;
        assert_loop_limit(
            super::scatter_add(gpu, t, t, one_id, largest + 1, 1),
            "vocab",
            largest,
        );
        Ok(())
    })
}

#[test]
fn embedding_at_the_loop_limit_matches_reference() -> Result<()> {
    let gpu = gpu();
    let tokens = largest_at_the_loop_limit(&gpu, super::loop_iterations) as usize;
    let (vocab, dim) = (3, 2);
    // Small integers: every f32 partial sum is exact, so a dropped token shows.
    let ids: Vec<u32> = (0..tokens).map(|t| (t % vocab) as u32).collect();
    let dy: Vec<f32> = (0..tokens * dim).map(|e| (e % 7) as f32 - 3.0).collect();
    let want = reference::scatter_add(&ids, &dy, vocab, dim);
    let dy_gpu = gpu.upload(&dy, Category::Temporary, "dy")?;
    let ids_gpu = upload_u32_at(&gpu, &ids, 0, "ids")?;
    let dtable = scratch(&gpu, (vocab * dim) as u64, "dtable");
    let (v, d) = (vocab as u64, dim as u64);
    super::scatter_add(&gpu, dtable.whole(), dy_gpu.whole(), ids_gpu.whole(), v, d)?;
    let got: Vec<f32> = gpu.read_all(&dtable, DEADLINE)?;
    assert_exact(&format!("scatter_add of {tokens} tokens"), &got, &want);

    // The largest vocabulary (the sort's prefix sum runs the longest loop), a few tokens, the
    // last row among them: every row's start must be right for its sum to land.
    let vocab = tokens;
    let ids: Vec<u32> = vec![(vocab - 1) as u32, 5, (vocab - 1) as u32, 0, 5];
    let dy: Vec<f32> = vec![1.0, 2.0, 4.0, 8.0, 16.0];
    let want = reference::scatter_add(&ids, &dy, vocab, 1);
    let dy_gpu = gpu.upload(&dy, Category::Temporary, "dy")?;
    let ids_gpu = upload_u32_at(&gpu, &ids, 0, "ids")?;
    let dtable = scratch(&gpu, vocab as u64, "dtable");
    let v = vocab as u64;
    super::scatter_add(&gpu, dtable.whole(), dy_gpu.whole(), ids_gpu.whole(), v, 1)?;
    let got: Vec<f32> = gpu.read_all(&dtable, DEADLINE)?;
    assert_exact(&format!("scatter_add over {vocab} rows"), &got, &want);
    Ok(())
}

// ------------------------------------------------------------------------------- reference

#[test]
fn embedding_gather_and_scatter_are_adjoint() {
    // table [3, 2]; ids [2, 0, 2]
    let table = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let ids = [2u32, 0, 2];
    assert_eq!(
        reference::gather(&table, &ids, 3, 2),
        [5.0, 6.0, 1.0, 2.0, 5.0, 6.0]
    );
    // row 2 gets dy rows 0 and 2, row 0 gets dy row 1, row 1 nothing
    let dy = [1.0, 10.0, 100.0, 1000.0, 2.0, 20.0];
    assert_eq!(
        reference::scatter_add(&ids, &dy, 3, 2),
        [100.0, 1000.0, 0.0, 0.0, 3.0, 30.0]
    );
    // <gather(T), dy> = <T, scatter_add(dy)>: scatter_add is the transpose of gather
    let mut rng = Rng::new(0x5eed_0006);
    let (vocab, dim) = (7, 3);
    let ids = [6u32, 1, 1, 0, 3, 6, 6];
    let t = rng.vec_f32(vocab * dim, -1.0, 1.0);
    let dy = rng.vec_f32(ids.len() * dim, -1.0, 1.0);
    let lhs = dot(&reference::gather(&t, &ids, vocab, dim), &dy);
    let rhs = dot(&t, &reference::scatter_add(&ids, &dy, vocab, dim));
    assert!((lhs - rhs).abs() < 1e-5, "{lhs} vs {rhs}");
    // an out-of-range id gathers NaN and scatters nothing
    assert!(
        reference::gather(&table, &[3], 3, 2)
            .iter()
            .all(|v| v.is_nan())
    );
    assert_eq!(reference::scatter_add(&[3], &[1.0, 1.0], 3, 2), [0.0; 6]);
}

/// A table kept in parts: each part's gather writes its ids' rows of one output (NaN for an id
/// past the table, from the part at row 0), and each part's scatter-add its rows of the
/// gradient: together, the whole table's gather and scatter-add.
#[test]
fn a_table_in_parts_gathers_and_scatters_as_the_whole() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(72);
    let (vocab, dim, tokens) = (23usize, 5usize, 41usize);
    let table = rng.vec_f32(vocab * dim, -3.0, 3.0);
    let mut ids: Vec<u32> = (0..tokens).map(|_| rng.below(vocab as u64) as u32).collect();
    ids[7] = vocab as u32 + 3; // past the table
    let dy = rng.vec_f32(tokens * dim, -1.0, 1.0);
    let ids_gpu = upload_u32_at(&gpu, &ids, 2, "ids")?;
    let ids_s = ids_gpu.slice(2, tokens as u64)?;
    let dy_gpu = Guarded::upload(&gpu, &mut rng, &dy, 1, "dy")?;
    let out_gpu = Guarded::random(&gpu, &mut rng, tokens * dim, 5, "out")?;
    let whole_dtable = reference::scatter_add(&ids, &dy, vocab, dim);
    let mut first = 0;
    for rows in [9usize, 1, 13] {
        let part = super::TablePart {
            first: first as u64,
            rows: rows as u64,
            total: vocab as u64,
        };
        let span = first * dim..(first + rows) * dim;
        let part_gpu = Guarded::upload(&gpu, &mut rng, &table[span.clone()], 3, "part")?;
        super::gather_part(&gpu, out_gpu.slice()?, part_gpu.slice()?, ids_s, part, dim as u64)?;
        let dpart = Guarded::random(&gpu, &mut rng, rows * dim, 7, "dpart")?;
        super::scatter_add_part(&gpu, dpart.slice()?, dy_gpu.slice()?, ids_s, part, dim as u64)?;
        let (atol, rtol) = SCATTER_TOL;
        let name = format!("scatter_add of rows {first}..{}", first + rows);
        dpart.check(&gpu, &name, &whole_dtable[span], atol, rtol)?;
        first += rows;
    }
    let want = reference::gather(&table, &ids, vocab, dim);
    out_gpu.check(&gpu, "gather in three parts", &want, 0.0, 0.0)?;
    Ok(())
}

/// A part that does not lie inside its table is refused.
#[test]
fn a_part_outside_its_table_is_refused() -> Result<()> {
    let gpu = gpu();
    let buffer = gpu.alloc_elements(64, Category::Temporary, "scratch")?;
    let s = buffer.whole();
    let part = super::TablePart {
        first: 3,
        rows: 4,
        total: 6,
    };
    let err = super::gather_part(&gpu, s.slice(0, 8)?, s.slice(8, 8)?, s.slice(16, 2)?, part, 2)
        .expect_err("rows 3..7 of 6");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    Ok(())
}
