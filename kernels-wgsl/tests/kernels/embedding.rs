use plimsoll_kernels_wgsl::kernels::embedding;
use plimsoll_kernels_wgsl::kernels::largest_within;
use plimsoll_kernels_wgsl::testing::{
    DEADLINE, Guarded, Rng, assert_close, assert_loop_limit, gpu, loop_limit_or_skip, scratch,
    upload_u32_at,
};
use plimsoll_kernels_wgsl::{Category, Error, Gpu, reference};

// Tolerances. gather copies words: exact. scatter_add sums at most 129 values in [-1, 1] in f32
// in ascending token order (f64 in the reference): the bound n^2 * 2^-24 ~ 1e-3 is loose; the
// rounding errors of <= 129 partial sums of size <= ~10 add up like a random walk,
// ~sqrt(129) * 10 * 2^-24 ~ 7e-6: atol 2e-5, rtol 1e-5.
const SCATTER_TOL: (f64, f64) = (2e-5, 1e-5);

fn check_case(gpu: &Gpu, rng: &mut Rng, tokens: usize, vocab: usize, dim: usize) {
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

    let table_gpu = Guarded::upload(gpu, rng, &table, 3, "table").unwrap();
    let ids_gpu = upload_u32_at(gpu, &ids, 2, "ids").unwrap();
    let out_gpu = Guarded::random(gpu, rng, tokens * dim, 5, "out").unwrap();
    let dy_gpu = Guarded::upload(gpu, rng, &dy, 1, "dy").unwrap();
    let dtable_gpu = Guarded::random(gpu, rng, vocab * dim, 7, "dtable").unwrap();
    let (t, v, d) = (tokens as u64, vocab as u64, dim as u64);
    let ids_s = ids_gpu.slice(2, t).unwrap();
    embedding::gather(
        gpu,
        out_gpu.slice().unwrap(),
        table_gpu.slice().unwrap(),
        ids_s,
        v,
        d,
    )
    .unwrap();
    embedding::scatter_add(
        gpu,
        dtable_gpu.slice().unwrap(),
        dy_gpu.slice().unwrap(),
        ids_s,
        v,
        d,
    )
    .unwrap();

    let want = reference::embedding::gather(&table, &ids, vocab, dim);
    out_gpu
        .check(gpu, &name("gather"), &want, 0.0, 0.0)
        .unwrap();
    let want = reference::embedding::scatter_add(&ids, &dy, vocab, dim);
    let (atol, rtol) = SCATTER_TOL;
    dtable_gpu
        .check(gpu, &name("scatter_add"), &want, atol, rtol)
        .unwrap();
}

#[test]
fn embedding_matches_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(71);
    for tokens in [1usize, 3, 37, 129] {
        for (vocab, dim) in [(1usize, 1usize), (7, 10), (50, 33), (13, 257), (31, 1000)] {
            check_case(&gpu, &mut rng, tokens, vocab, dim);
        }
    }
}

#[test]
fn embedding_rejects_bad_ranges() {
    let gpu = gpu();
    let table = scratch(&gpu, 40, "table");
    let ids = upload_u32_at(&gpu, &[0, 1, 2], 0, "ids").unwrap();
    let out = gpu.alloc_elements(30, Category::Temporary, "out").unwrap();
    let (tw, iw, ow) = (table.whole(), ids.whole(), out.whole());
    embedding::gather(&gpu, ow, tw, iw, 4, 10).unwrap();
    // 5 tokens of ids in a 3-element buffer: no such slice ...
    let err = ids.slice(0, 5).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("elements 0..5"), "{err}");
    // ... and 5 ids want 50 outputs, not 30.
    let ids5 = upload_u32_at(&gpu, &[0, 1, 2, 3, 0], 0, "ids5").unwrap();
    let err = embedding::gather(&gpu, ow, tw, ids5.whole(), 4, 10).unwrap_err();
    assert!(err.to_string().contains("out: 30 elements given"), "{err}");
    // A [5, 10] table in 40 elements.
    let err = embedding::gather(&gpu, ow, tw, iw, 5, 10).unwrap_err();
    assert!(
        err.to_string().contains("table: 40 elements given"),
        "{err}"
    );
    // out from offset 1: 30 elements do not fit, 29 are too few.
    let err = out.slice(1, 30).unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { .. }) && err.to_string().contains("elements 1..31"),
        "{err}"
    );
    let err = embedding::gather(&gpu, out.slice(1, 29).unwrap(), tw, iw, 4, 10).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    // scatter_add with ids from offset 1: elements 1..4 of 3 do not fit; the 2 that do make
    // 2 tokens, whose dy is 20 elements, not 30.
    let err = ids.slice(1, 3).unwrap_err();
    assert!(err.to_string().contains("elements 1..4"), "{err}");
    let ids2 = ids.slice(1, 2).unwrap();
    let err = embedding::scatter_add(&gpu, tw, ow, ids2, 4, 10).unwrap_err();
    assert!(err.to_string().contains("dy: 30 elements given"), "{err}");
    let err = embedding::scatter_add(&gpu, table.slice(0, 39).unwrap(), ow, iw, 4, 10).unwrap_err();
    assert!(
        err.to_string().contains("dtable: 39 elements given"),
        "{err}"
    );
    // dim 0: empty work.
    let (t0, o0) = (table.slice(0, 0).unwrap(), out.slice(0, 0).unwrap());
    embedding::scatter_add(&gpu, t0, o0, ids2, 4, 0).unwrap();
}

#[test]
fn embedding_refuses_tokens_over_the_loop_limit() {
    let gpu = gpu();
    let Some(limit) = loop_limit_or_skip(&gpu, "embedding_refuses_tokens_over_the_loop_limit")
    else {
        return;
    };
    let largest = largest_within(limit, embedding::loop_iterations);
    // The token count is the ids' length: a real buffer of `largest + 1` ids; the rest are tiny
    // (the loop limit is checked before their lengths).
    let ids = scratch(&gpu, largest + 1, "ids");
    let t = gpu.alloc_elements(1, Category::Temporary, "tiny").unwrap();
    let t = t.whole();
    assert_loop_limit(
        embedding::scatter_add(&gpu, t, t, ids.whole(), 1, 1),
        "tokens",
        largest,
    );
    // The sort's prefix sum loops over the rows: a vocabulary past the limit is refused too.
    let one_id = ids.slice(0, 1).unwrap();
    assert_loop_limit(
        embedding::scatter_add(&gpu, t, t, one_id, largest + 1, 1),
        "vocab",
        largest,
    );
}

#[test]
fn embedding_at_the_loop_limit_matches_reference() {
    let gpu = gpu();
    let limit = gpu.loop_iteration_limit().unwrap_or(65_535);
    let (tokens, vocab, dim) = (
        largest_within(limit, embedding::loop_iterations) as usize,
        3,
        2,
    );
    // Small integers: every f32 partial sum is exact, so a dropped token shows.
    let ids: Vec<u32> = (0..tokens).map(|t| (t % vocab) as u32).collect();
    let dy: Vec<f32> = (0..tokens * dim).map(|e| (e % 7) as f32 - 3.0).collect();
    let want = reference::embedding::scatter_add(&ids, &dy, vocab, dim);
    let dy_gpu = gpu.upload(&dy, Category::Temporary, "dy").unwrap();
    let ids_gpu = upload_u32_at(&gpu, &ids, 0, "ids").unwrap();
    let dtable = scratch(&gpu, (vocab * dim) as u64, "dtable");
    let (v, d) = (vocab as u64, dim as u64);
    embedding::scatter_add(&gpu, dtable.whole(), dy_gpu.whole(), ids_gpu.whole(), v, d).unwrap();
    let got: Vec<f32> = gpu.read_all(&dtable, DEADLINE).unwrap();
    assert_close(
        &format!("scatter_add of {tokens} tokens"),
        &got,
        &want,
        0.0,
        0.0,
    );

    // The largest vocabulary (the sort's prefix sum runs the longest loop), a few tokens, the
    // last row among them: every row's start must be right for its sum to land.
    let vocab = tokens;
    let ids: Vec<u32> = vec![(vocab - 1) as u32, 5, (vocab - 1) as u32, 0, 5];
    let dy: Vec<f32> = vec![1.0, 2.0, 4.0, 8.0, 16.0];
    let want = reference::embedding::scatter_add(&ids, &dy, vocab, 1);
    let dy_gpu = gpu.upload(&dy, Category::Temporary, "dy").unwrap();
    let ids_gpu = upload_u32_at(&gpu, &ids, 0, "ids").unwrap();
    let dtable = scratch(&gpu, vocab as u64, "dtable");
    let v = vocab as u64;
    embedding::scatter_add(&gpu, dtable.whole(), dy_gpu.whole(), ids_gpu.whole(), v, 1).unwrap();
    let got: Vec<f32> = gpu.read_all(&dtable, DEADLINE).unwrap();
    assert_close(
        &format!("scatter_add over {vocab} rows"),
        &got,
        &want,
        0.0,
        0.0,
    );
}
