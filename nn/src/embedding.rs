//! [`Embedding`]: a `[vocab, dim]` table of learned rows picked by u32 ids. A table larger than
//! one binding of the device is kept in parts of whole rows ([`Embedding::in_parts`]), each a
//! parameter of its own, and looked up by one launch per part.

use plimsoll_autograd::{Category, DType, Derivative, Gpu, Grads, Tensor, TensorOptions};
use plimsoll_kernels_wgsl::kernels::embedding::{self, TablePart};

use crate::error::{Error, Result};
use crate::module::Module;

/// A lookup table. Parameter: `weight` `[vocab, dim]`, drawn from `N(0, 1)` (PyTorch's
/// default). Forward takes a u32 tensor of ids of any shape and gives `[ids.., dim]`.
#[derive(Debug, Clone)]
pub struct Embedding {
    /// `[vocab, dim]`, or (a table in parts) the first part.
    weight: Tensor,
    /// The parts after the first, each `[rows, dim]` (empty: the table is one tensor).
    rest: Vec<Tensor>,
    training: bool,
}

impl Embedding {
    /// A table of `vocab` rows of `dim` values, from `seed`. Errors: a zero extent.
    pub fn new(gpu: &Gpu, vocab: usize, dim: usize, seed: u64) -> Result<Embedding> {
        if vocab == 0 || dim == 0 {
            return Err(Error::InvalidConfig {
                what: "Embedding::new",
                message: format!("vocab {vocab} and dim {dim} must both be at least 1"),
            });
        }
        let weight = Tensor::normal(
            gpu,
            &[vocab, dim],
            0.0,
            1.0,
            seed,
            TensorOptions::parameter("embedding.weight"),
        )?;
        Ok(Embedding {
            weight,
            rest: Vec::new(),
            training: true,
        })
    }

    /// A table with the given `[vocab, dim]` weight (taken as it is: pass a parameter leaf to
    /// train it). Errors: a weight that is not a non-empty matrix.
    pub fn from_weight(weight: Tensor) -> Result<Embedding> {
        if weight.rank() != 2 || weight.numel() == 0 {
            return Err(Error::InvalidConfig {
                what: "Embedding::from_weight",
                message: format!(
                    "weight {:?} must be a non-empty [vocab, dim]",
                    weight.shape()
                ),
            });
        }
        Ok(Embedding {
            weight,
            rest: Vec::new(),
            training: true,
        })
    }

    /// A table kept in `parts` of whole rows, in order (each `[rows, dim]`, one `dim`; pass
    /// parameter leaves to train them): what a table larger than one binding needs. Errors: no
    /// part, or parts that are not non-empty matrices of one width.
    pub fn in_parts(parts: Vec<Tensor>) -> Result<Embedding> {
        let dim = parts.first().and_then(|p| p.shape().get(1).copied());
        let fits = !parts.is_empty()
            && parts
                .iter()
                .all(|p| p.rank() == 2 && p.numel() > 0 && p.shape().get(1).copied() == dim);
        if !fits {
            let shapes: Vec<_> = parts.iter().map(|p| p.shape().to_vec()).collect();
            return Err(Error::InvalidConfig {
                what: "Embedding::in_parts",
                message: format!("parts {shapes:?} must be non-empty [rows, dim] of one dim"),
            });
        }
        let mut parts = parts.into_iter();
        let weight = parts.next().ok_or_else(|| Error::InvalidConfig {
            what: "Embedding::in_parts",
            message: "no part".to_string(),
        })?;
        Ok(Embedding {
            weight,
            rest: parts.collect(),
            training: true,
        })
    }

    /// The table, `[vocab, dim]`; for a table in parts, its first part (see
    /// [`Embedding::parts`]).
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The table's parts in order: one (the whole table) unless it was made
    /// [`Embedding::in_parts`].
    pub fn parts(&self) -> Vec<&Tensor> {
        std::iter::once(&self.weight).chain(&self.rest).collect()
    }

    /// Rows of the whole table.
    pub fn rows(&self) -> usize {
        self.parts().iter().map(|p| p.shape()[0]).sum()
    }
}

/// Rows of a `[rows, dim]` f32 table that fit one binding of `max_binding_bytes`: the part
/// size of a table kept in parts. At least 1.
pub fn rows_per_part(dim: usize, max_binding_bytes: u64) -> usize {
    let row_bytes = 4 * dim.max(1) as u64;
    usize::try_from((max_binding_bytes / row_bytes).max(1)).unwrap_or(usize::MAX)
}

/// Rows of `ids` looked up in a table kept in `parts` (one launch of the embedding kernel per
/// part), recorded as one op whose backward scatters into each part's gradient.
fn lookup_in_parts(ids: &Tensor, parts: &[&Tensor]) -> Result<Tensor> {
    let dim = parts.first().map_or(0, |p| p.shape()[1]);
    let total = parts.iter().map(|p| p.shape()[0]).sum::<usize>();
    let gpu = ids.gpu();
    let mut shape = ids.shape().to_vec();
    shape.push(dim);
    let inputs: Vec<&Tensor> = std::iter::once(ids).chain(parts.iter().copied()).collect();
    let out = Tensor::empty(gpu, &shape, Tensor::output_category(&inputs), "embedding")?;
    let mut first = 0;
    let mut table = Vec::with_capacity(parts.len());
    for p in parts {
        let part = TablePart {
            first: first as u64,
            rows: p.shape()[0] as u64,
            total: total as u64,
        };
        let (o, w, i) = (out.elements()?, p.elements()?, ids.elements()?);
        embedding::gather_part(gpu, o, w, i, part, dim as u64)?;
        table.push(part);
        first += p.shape()[0];
    }
    Ok(Tensor::from_op(out, &inputs, || LookupInParts {
        ids: ids.detach(),
        table,
        dim,
    })?)
}

/// What [`lookup_in_parts`]'s backward reads: the ids and where each part lies.
#[derive(Debug, Clone)]
struct LookupInParts {
    ids: Tensor,
    table: Vec<TablePart>,
    dim: usize,
}

impl Derivative for LookupInParts {
    /// No gradient for the ids; each part's, the sums of `g`'s rows over its ids.
    fn backward(&self, g: &Tensor, needs: &[bool]) -> plimsoll_autograd::Result<Grads> {
        let g = g.widened()?;
        let gpu = g.gpu();
        let mut grads: Grads = Grads::new();
        grads.push(None);
        for (i, part) in self.table.iter().enumerate() {
            if !needs.get(i + 1).copied().unwrap_or(true) {
                grads.push(None);
                continue;
            }
            let shape = [part.rows as usize, self.dim];
            let d = Tensor::empty(gpu, &shape, Category::Temporary, "embedding part grad")?;
            let (dp, gy, ids) = (d.elements()?, g.elements()?, self.ids.elements()?);
            embedding::scatter_add_part(gpu, dp, gy, ids, *part, self.dim as u64)?;
            grads.push(Some(d));
        }
        Ok(grads)
    }
}

impl Module for Embedding {
    /// Rows of the table for u32 `ids` (an id `>= vocab` gives a row of NaN, see
    /// [`Tensor::embedding`]).
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        if ids.dtype() != DType::U32 {
            return Err(Error::InputShape {
                module: "Embedding",
                expected: "u32 token ids (Tensor::from_indices)".to_string(),
                found: ids.shape().to_vec(),
            });
        }
        if self.rest.is_empty() {
            return Ok(self.weight.embedding(ids)?);
        }
        lookup_in_parts(ids, &self.parts())
    }

    /// `weight`, or for a table in parts `weight.part0`, `weight.part1`, ...
    fn parameters(&self) -> Vec<(String, Tensor)> {
        if self.rest.is_empty() {
            return vec![("weight".to_string(), self.weight.clone())];
        }
        let parts = self.parts().into_iter().enumerate();
        parts
            .map(|(i, p)| (format!("weight.part{i}"), p.clone()))
            .collect()
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}
