use plimsoll_kernels_wgsl::kernels::embedding::{self, GatherBuffers, ScatterAddBuffers};
use plimsoll_kernels_wgsl::kernels::largest_within;
use plimsoll_kernels_wgsl::{Category, Gpu, reference};

use crate::common::{
    DEADLINE, Guarded, Rng, assert_close, assert_loop_limit, gpu, loop_limit_or_note, upload_u32_at,
};

// Tolerances. gather copies words: exact. scatter_add sums at most 129 values in [-1, 1] in f32
// in ascending token order (f64 in the reference): the bound n^2 * 2^-24 ~ 1e-3 is loose; the
// rounding errors of <= 129 partial sums of size <= ~10 add up like a random walk,
// ~sqrt(129) * 10 * 2^-24 ~ 7e-6: atol 2e-5, rtol 1e-5.
const SCATTER_TOL: (f32, f32) = (2e-5, 1e-5);

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

    let table_gpu = Guarded::upload(gpu, rng, &table, 3, "table");
    let ids_gpu = upload_u32_at(gpu, &ids, 2, "ids");
    let out_gpu = Guarded::random(gpu, rng, tokens * dim, 5, "out");
    let dy_gpu = Guarded::upload(gpu, rng, &dy, 1, "dy");
    let dtable_gpu = Guarded::random(gpu, rng, vocab * dim, 7, "dtable");
    let gather = GatherBuffers {
        table: &table_gpu.buffer,
        table_offset: table_gpu.at(),
        ids: &ids_gpu,
        ids_offset: 2,
        out: &out_gpu.buffer,
        out_offset: out_gpu.at(),
    };
    let (t, v, d) = (tokens as u64, vocab as u64, dim as u64);
    embedding::gather(gpu, &gather, t, v, d).unwrap();
    let scatter = ScatterAddBuffers {
        dy: &dy_gpu.buffer,
        dy_offset: dy_gpu.at(),
        ids: &ids_gpu,
        ids_offset: 2,
        dtable: &dtable_gpu.buffer,
        dtable_offset: dtable_gpu.at(),
    };
    embedding::scatter_add(gpu, &scatter, t, v, d).unwrap();

    let want = reference::embedding::gather(&table, &ids, vocab, dim);
    out_gpu.check(gpu, &name("gather"), &want, 0.0, 0.0);
    let want = reference::embedding::scatter_add(&ids, &dy, vocab, dim);
    let (atol, rtol) = SCATTER_TOL;
    dtable_gpu.check(gpu, &name("scatter_add"), &want, atol, rtol);
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
    let table = gpu
        .alloc_elements(40, Category::Temporary, "table")
        .unwrap();
    let ids = upload_u32_at(&gpu, &[0, 1, 2], 0, "ids");
    let out = gpu.alloc_elements(30, Category::Temporary, "out").unwrap();
    let mut b = GatherBuffers {
        table: &table,
        table_offset: 0,
        ids: &ids,
        ids_offset: 0,
        out: &out,
        out_offset: 0,
    };
    embedding::gather(&gpu, &b, 3, 4, 10).unwrap();
    // 5 tokens of ids in a 3-element buffer; a [5, 10] table in 40 elements.
    let err = embedding::gather(&gpu, &b, 5, 4, 10).unwrap_err();
    assert!(err.to_string().contains("ids: elements 0..5"), "{err}");
    assert!(embedding::gather(&gpu, &b, 3, 5, 10).is_err());
    b.out_offset = 1;
    assert!(embedding::gather(&gpu, &b, 3, 4, 10).is_err());
    let s = ScatterAddBuffers {
        dy: &out,
        dy_offset: 0,
        ids: &ids,
        ids_offset: 1,
        dtable: &table,
        dtable_offset: 0,
    };
    let err = embedding::scatter_add(&gpu, &s, 3, 4, 10).unwrap_err();
    assert!(err.to_string().contains("ids: elements 1..4"), "{err}");
    embedding::scatter_add(&gpu, &s, 2, 4, 0).unwrap(); // dim 0: empty work
}

#[test]
fn embedding_refuses_tokens_over_the_loop_limit() {
    let gpu = gpu();
    let Some(limit) = loop_limit_or_note(&gpu, "embedding") else {
        return;
    };
    let largest = largest_within(limit, embedding::loop_iterations);
    let t = gpu.alloc_elements(1, Category::Temporary, "tiny").unwrap();
    let s = ScatterAddBuffers {
        dy: &t,
        dy_offset: 0,
        ids: &t,
        ids_offset: 0,
        dtable: &t,
        dtable_offset: 0,
    };
    assert_loop_limit(
        embedding::scatter_add(&gpu, &s, largest + 1, 1, 1),
        "tokens",
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
    let ids_gpu = upload_u32_at(&gpu, &ids, 0, "ids");
    let dtable = gpu
        .alloc_elements((vocab * dim) as u64, Category::Temporary, "dtable")
        .unwrap();
    let s = ScatterAddBuffers {
        dy: &dy_gpu,
        dy_offset: 0,
        ids: &ids_gpu,
        ids_offset: 0,
        dtable: &dtable,
        dtable_offset: 0,
    };
    embedding::scatter_add(&gpu, &s, tokens as u64, vocab as u64, dim as u64).unwrap();
    let got: Vec<f32> = gpu.read_all(&dtable, DEADLINE).unwrap();
    assert_close(
        &format!("scatter_add of {tokens} tokens"),
        &got,
        &want,
        0.0,
        0.0,
    );
}
