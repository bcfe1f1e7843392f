//! The tape: [`Node`]s recorded in execution order, and the backward walk over them.
//!
//! Ownership follows the tensors: a non-leaf [`Tensor`] holds an `Arc` to the node that made it;
//! a node holds its [`Op`] (which carries the tensors it saved) and edges to its inputs' nodes or
//! leaf gradient slots. Nodes never hold their outputs, so a tensor that no node saved is freed
//! as soon as the user drops it, and dropping the loss without calling backward frees the whole
//! graph. [`Node`]'s `Drop` is iterative, so a 10 000-node chain cannot overflow the stack.
//!
//! Backward collects the reachable nodes with an explicit stack, orders them by sequence number
//! (execution order) descending, and runs one exhaustive `match` per node
//! (`backward::backward_op`). Right after a node's backward its op, and with it the saved
//! tensors, is dropped: a tensor saved by several nodes (an `Arc`-shared storage) is freed after the last of
//! them. Each node's incoming gradient is dropped once consumed. Without `retain_graph` the
//! nodes are marked released and emptied; a second backward through them is
//! [`Error::BackwardTwice`].

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use plimsoll_kernels_wgsl::Category;
use smallvec::SmallVec;

use crate::backward::{Lent, writes_blank};
use crate::error::{Error, Result};
use crate::grad_mode::{is_grad_enabled, no_grad};
use crate::op::Op;
use crate::pending::Pending;
use crate::tensor::{Autograd, GradSlot, Tensor, TensorOptions, lock};

/// Global execution order of recorded nodes.
static NEXT_SEQUENCE: AtomicU64 = AtomicU64::new(1);

/// Where an input's gradient goes.
#[derive(Clone)]
pub(crate) enum Edge {
    /// The input requires no grad: its gradient is not needed.
    Constant,
    /// A leaf: accumulate into its slot.
    Leaf(Arc<GradSlot>),
    /// An op's output: add into that node's incoming gradient.
    Node(Arc<Node>),
}

/// Mutable part of a node. Invariant: `released` implies `op` is `None` and `inputs` empty.
struct NodeState {
    /// What the node did and saved; taken (and so freed) by the backward that releases it.
    op: Option<Op>,
    inputs: SmallVec<[Edge; 2]>,
    released: bool,
}

/// One recorded op.
pub struct Node {
    /// Execution order (unique, increasing).
    pub(crate) sequence: u64,
    /// Shape of the node's output (its incoming gradient's shape).
    pub(crate) output_shape: crate::Shape,
    state: Mutex<NodeState>,
}

impl Drop for Node {
    fn drop(&mut self) {
        // Unlink children by hand: the last owner of a long chain would otherwise recurse once
        // per node.
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let mut stack: Vec<Arc<Node>> = node_edges(std::mem::take(&mut state.inputs));
        while let Some(node) = stack.pop() {
            if let Ok(mut node) = Arc::try_unwrap(node) {
                let state = node.state.get_mut().unwrap_or_else(|p| p.into_inner());
                stack.extend(node_edges(std::mem::take(&mut state.inputs)));
            }
        }
    }
}

fn node_edges(edges: SmallVec<[Edge; 2]>) -> Vec<Arc<Node>> {
    edges
        .into_iter()
        .filter_map(|e| match e {
            Edge::Node(n) => Some(n),
            _ => None,
        })
        .collect()
}

fn edge_of(t: &Tensor) -> Edge {
    match &t.autograd {
        Autograd::None => Edge::Constant,
        Autograd::Leaf(slot) => Edge::Leaf(Arc::clone(slot)),
        Autograd::Node(node) => Edge::Node(Arc::clone(node)),
    }
}

/// Whether an op over `inputs` records a node: grad mode is on and some input requires grad.
pub(crate) fn records(inputs: &[&Tensor]) -> bool {
    is_grad_enabled() && inputs.iter().any(|t| t.requires_grad())
}

/// Category of an op's output: `Activation` inside a graph, `Temporary` outside.
pub(crate) fn output_category(recording: bool) -> Category {
    if recording {
        Category::Activation
    } else {
        Category::Temporary
    }
}

/// Makes `output` the output of a new node for `op` (with what it saved) over `inputs` (call
/// only when [`records`] said so, so that `no_grad` saves nothing). Under
/// [`crate::f16_activations`] the activations `op` saved are stored in f16 first (which
/// allocates, and so can fail).
pub(crate) fn attach(output: Tensor, mut op: Op, inputs: &[&Tensor]) -> Result<Tensor> {
    crate::half::save_in_f16(&mut op)?;
    let mut output = crate::half::output_in_f16(&op, output)?;
    let node = Node {
        sequence: NEXT_SEQUENCE.fetch_add(1, Ordering::Relaxed),
        output_shape: output.shape.clone(),
        state: Mutex::new(NodeState {
            op: Some(op),
            inputs: inputs.iter().map(|t| edge_of(t)).collect(),
            released: false,
        }),
    };
    output.autograd = Autograd::Node(Arc::new(node));
    Ok(output)
}

/// `output`, made the output of a new node for `op()` over `inputs` when [`records`] says an op
/// over them records; otherwise `output` as it is, and `op` (with the tensors it would save)
/// is never built.
pub(crate) fn record(
    output: Tensor,
    inputs: &[&Tensor],
    op: impl FnOnce() -> Op,
) -> Result<Tensor> {
    if records(inputs) {
        attach(output, op(), inputs)
    } else {
        Ok(output)
    }
}

/// Entry point of [`Tensor::backward`].
pub(crate) fn backward(root: &Tensor, seed: Option<&Tensor>, retain_graph: bool) -> Result<()> {
    let _no_grad = no_grad();
    let seed = match seed {
        Some(s) if s.shape != root.shape => {
            return Err(Error::SeedShape {
                shape: root.shape.to_vec(),
                seed: s.shape.to_vec(),
            });
        }
        Some(s) => s.detach(),
        None if root.numel() != 1 => {
            return Err(Error::NonScalarBackward {
                shape: root.shape.to_vec(),
            });
        }
        None => {
            let options = TensorOptions {
                category: Category::Temporary,
                label: "backward seed",
                requires_grad: false,
            };
            Tensor::ones(&root.gpu, &root.shape, options)?
        }
    };
    match &root.autograd {
        Autograd::None => Err(Error::NoGraph),
        Autograd::Leaf(slot) => slot.accumulate(&seed),
        Autograd::Node(node) => backward_from(node, seed, retain_graph),
    }
}

/// The reachable nodes from `root`, latest first. Errors if one was already released.
fn reachable(root: &Arc<Node>) -> Result<Vec<Arc<Node>>> {
    let mut seen = HashSet::new();
    let mut nodes = Vec::new();
    let mut stack = vec![Arc::clone(root)];
    while let Some(node) = stack.pop() {
        if !seen.insert(node.sequence) {
            continue;
        }
        {
            let state = lock(&node.state);
            if state.released {
                return Err(Error::BackwardTwice);
            }
            stack.extend(state.inputs.iter().filter_map(|e| match e {
                Edge::Node(n) => Some(Arc::clone(n)),
                _ => None,
            }));
        }
        nodes.push(node);
    }
    nodes.sort_unstable_by_key(|n| std::cmp::Reverse(n.sequence));
    Ok(nodes)
}

/// For `child`, a node no gradient has reached yet: when it is a leading-axis slice of another
/// node, or reshapes of one (whose backward passes views), its place in a buffer that node's
/// gradient will be ([`Pending::lend`]), viewed as `child`'s output, with the node's sequence
/// and the place's offset. `None` otherwise, or when the place overlaps one already lent.
fn lend_place(
    child: &Arc<Node>,
    incoming: &mut HashMap<u64, Pending>,
    gpu: &crate::Gpu,
) -> Result<Option<(Tensor, (u64, usize))>> {
    let len = crate::tensor::numel(&child.output_shape);
    let mut node = Arc::clone(child);
    loop {
        let next = {
            let state = lock(&node.state);
            match (&state.op, &state.inputs[..]) {
                (Some(Op::Reshape { .. }), [Edge::Node(parent)]) => (Arc::clone(parent), None),
                (Some(Op::Slice { input, axis, start }), [Edge::Node(parent)])
                    if input[..*axis].iter().all(|&e| e == 1) =>
                {
                    let inner: usize = input[axis + 1..].iter().product();
                    (Arc::clone(parent), Some(start * inner))
                }
                _ => return Ok(None),
            }
        };
        match next {
            (parent, None) => node = parent,
            (parent, Some(offset)) => {
                let pending = incoming.entry(parent.sequence).or_default();
                let place = (offset, len);
                let view = pending.lend(gpu, &parent.output_shape, place, &child.output_shape)?;
                return Ok(view.map(|t| (t, (parent.sequence, offset))));
            }
        }
    }
}

/// Runs backward from `root` with incoming gradient `seed` (grad mode is off).
pub(crate) fn backward_from(root: &Arc<Node>, seed: Tensor, retain_graph: bool) -> Result<()> {
    let nodes = reachable(root)?;
    let mut incoming: HashMap<u64, Pending> = HashMap::new();
    incoming.entry(root.sequence).or_default().add_dense(seed)?;
    for node in &nodes {
        let (op, inputs) = {
            let mut state = lock(&node.state);
            if retain_graph {
                (state.op.clone(), state.inputs.clone())
            } else {
                state.released = true;
                (state.op.take(), std::mem::take(&mut state.inputs))
            }
        };
        let Some(pending) = incoming.remove(&node.sequence).filter(|p| !p.is_empty()) else {
            continue; // no gradient reached this node (every path to it was constant)
        };
        let grad = pending.into_tensor(&node.output_shape)?;
        let mut op = op.ok_or(Error::BackwardTwice)?;
        crate::half::restore_f32(&mut op)?;
        if grad.shape != node.output_shape {
            return Err(Error::SeedShape {
                shape: node.output_shape.to_vec(),
                seed: grad.shape.to_vec(),
            });
        }
        let needs: SmallVec<[bool; 4]> = inputs
            .iter()
            .map(|e| !matches!(e, Edge::Constant))
            .collect();
        let leaves: SmallVec<[Option<&GradSlot>; 4]> = inputs
            .iter()
            .map(|e| match e {
                Edge::Leaf(slot) => Some(&**slot),
                _ => None,
            })
            .collect();
        // A contiguous slice of another node's output: its gradient waits there as a piece.
        if let (Op::Slice { input, axis, start }, [Edge::Node(child)]) = (&op, &inputs[..])
            && input[..*axis].iter().all(|&e| e == 1)
        {
            let inner: usize = input[axis + 1..].iter().product();
            let pending = incoming.entry(child.sequence).or_default();
            pending.add_piece(start * inner, grad);
            continue;
        }
        // Buffers lent for the inputs' gradients (backward::Lent): the gradient a node input has
        // so far, where nothing else holds it, for the op to add into in its kernel; or, for an
        // input no gradient has reached yet that is a slice of another node (or a reshape of
        // one), its place in that node's gradient, for an op that writes there.
        let mut blanks: SmallVec<[Option<(u64, usize)>; 4]> = SmallVec::new();
        let mut lent: SmallVec<[Option<Lent>; 4]> = SmallVec::new();
        for (i, e) in inputs.iter().enumerate() {
            let (l, blank) = match e {
                Edge::Node(child) => match incoming.get_mut(&child.sequence) {
                    Some(p) => (p.take_sole_dense(&child.output_shape).map(Lent::Sum), None),
                    None if needs[i] && writes_blank(&op, i) => {
                        match lend_place(child, &mut incoming, &grad.gpu)? {
                            Some((t, place)) => (Some(Lent::Blank(t)), Some(place)),
                            None => (None, None),
                        }
                    }
                    None => (None, None),
                },
                _ => (None, None),
            };
            lent.push(l);
            blanks.push(blank);
        }
        let grads = crate::backward::backward_op(&op, &grad, &needs, &leaves, &mut lent);
        // Those not used go back before anything else is added (the same order of additions).
        for ((edge, left), blank) in inputs.iter().zip(lent).zip(&blanks) {
            match (edge, left, blank) {
                (Edge::Node(child), Some(Lent::Sum(g)), _) => {
                    incoming.entry(child.sequence).or_default().put_back(g)?;
                }
                (_, Some(Lent::Blank(_)), Some((parent, offset))) => {
                    if let Some(p) = incoming.get_mut(parent) {
                        p.unlend(*offset);
                    }
                }
                _ => {}
            }
        }
        let grads = grads?;
        // The op's saved tensors and the incoming gradient are released here, right after their
        // last use.
        drop(op);
        drop(grad);
        for (edge, g) in inputs.iter().zip(grads) {
            let Some(g) = g else { continue };
            match edge {
                Edge::Constant => {}
                Edge::Leaf(slot) => slot.accumulate(&g)?,
                Edge::Node(child) => incoming.entry(child.sequence).or_default().add_dense(g)?,
            }
        }
    }
    Ok(())
}
