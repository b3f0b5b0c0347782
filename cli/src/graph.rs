//! `--graph`: the demo's training step captured once per batch size as a device graph and
//! replayed (semantics §5.9). The parameters, the batch, every activation and gradient
//! live in one [`GraphMemory`]; a step uploads its batch into the same regions, replays
//! the graph and reads the loss back, so it transfers exactly the batch in and the loss
//! out, allocates nothing, and launches one graph.
//!
//! The arithmetic is the tensor path's, operation for operation ([`crate::model::Mlp`]):
//! the same kernels on the same shapes, so the replayed losses match the launched ones.

use std::collections::HashMap;

use ndmem::device::{BinaryOp, Device, Graph, GraphMemory, Region, UnaryOp};
use ndmem::Result;

use crate::model::{initial_values, Dims};

/// The regions of one captured step (one batch size).
#[derive(Debug)]
struct Step {
    graph: Graph,
    x: Region,
    y: Region,
    loss: Region,
}

/// Parameter regions: `w1 [inputs, hidden]`, `b1 [hidden]`, `w2 [hidden, classes]`,
/// `b2 [classes]`.
#[derive(Debug, Clone, Copy)]
struct Params {
    w1: Region,
    b1: Region,
    w2: Region,
    b2: Region,
}

/// The MLP trained through captured graphs on one device.
#[derive(Debug)]
pub struct GraphTrainer {
    dims: Dims,
    lr: f32,
    memory: GraphMemory,
    params: Params,
    steps: HashMap<usize, Step>,
    /// Rows of the largest batch, which sizes every step's activations.
    max_rows: usize,
}

impl GraphTrainer {
    /// The model of `seed` (the same initial values as the other modes) on `device`, for
    /// batches of at most `max_rows` rows, trained with learning rate `lr`.
    pub fn new(device: &Device, dims: Dims, seed: u64, max_rows: usize, lr: f32) -> Result<Self> {
        let [w1, b1, w2, b2] = initial_values(dims, seed);
        let floats = |n: usize| n * 4 + ndmem::device::REGION_ALIGN;
        let params =
            floats(w1.0.len()) + floats(b1.0.len()) + floats(w2.0.len()) + floats(b2.0.len());
        // Per batch size: x, y, and 16 activations or gradients no larger than
        // `rows * max(inputs, hidden, classes)` or a parameter.
        let widest = dims.inputs.max(dims.hidden).max(dims.classes);
        let per_step = 18 * floats(max_rows * widest)
            + 4 * floats(dims.inputs * dims.hidden.max(dims.classes))
            + floats(dims.hidden * dims.classes);
        // Two batch sizes at most (full batches and the last, shorter one of an epoch).
        let mut memory = device.graph_memory(params + 2 * per_step)?;
        let params = Params {
            w1: memory.floats(w1.0.len())?,
            b1: memory.floats(b1.0.len())?,
            w2: memory.floats(w2.0.len())?,
            b2: memory.floats(b2.0.len())?,
        };
        memory.upload_f32(params.w1, &w1.0)?;
        memory.upload_f32(params.b1, &b1.0)?;
        memory.upload_f32(params.w2, &w2.0)?;
        memory.upload_f32(params.b2, &b2.0)?;
        Ok(GraphTrainer {
            dims,
            lr,
            memory,
            params,
            steps: HashMap::new(),
            max_rows,
        })
    }

    /// Graphs captured so far (one per batch size seen).
    pub fn graphs(&self) -> usize {
        self.steps.len()
    }

    /// Device operations one replayed step runs.
    pub fn ops_per_step(&self) -> usize {
        self.steps
            .values()
            .map(|s| s.graph.ops())
            .max()
            .unwrap_or(0)
    }

    /// One SGD step on `x [rows, inputs]` with one-hot `y [rows, classes]`; returns the
    /// loss before the update. The first step of a batch size captures its graph.
    pub fn step(&mut self, x: &[f32], y: &[f32]) -> Result<f32> {
        let rows = x.len() / self.dims.inputs.max(1);
        if rows == 0 || rows > self.max_rows || y.len() != rows * self.dims.classes {
            return Err(ndmem::Error::Shape {
                op: "graph step".into(),
                message: format!(
                    "a batch of {} and {} floats for {} inputs and {} classes (at most {} rows)",
                    x.len(),
                    y.len(),
                    self.dims.inputs,
                    self.dims.classes,
                    self.max_rows
                ),
            });
        }
        if !self.steps.contains_key(&rows) {
            let step = self.capture(rows)?;
            self.steps.insert(rows, step);
        }
        let step = &self.steps[&rows];
        self.memory.upload_f32(step.x, x)?;
        self.memory.upload_f32(step.y, y)?;
        self.memory.launch(&step.graph)?;
        Ok(self.memory.download_f32(step.loss)?[0])
    }

    /// Captures the step for batches of `rows` rows.
    fn capture(&mut self, rows: usize) -> Result<Step> {
        let Dims {
            inputs,
            hidden,
            classes,
        } = self.dims;
        let p = self.params;
        let m = &mut self.memory;
        let x = m.floats(rows * inputs)?;
        let y = m.floats(rows * classes)?;
        let z1a = m.floats(rows * hidden)?;
        let z1 = m.floats(rows * hidden)?;
        let h = m.floats(rows * hidden)?;
        let la = m.floats(rows * classes)?;
        let logits = m.floats(rows * classes)?;
        let log_p = m.floats(rows * classes)?;
        let t = m.floats(rows * classes)?;
        let total = m.floats(1)?;
        let loss = m.floats(1)?;
        let prob = m.floats(rows * classes)?;
        let dl0 = m.floats(rows * classes)?;
        let d_logits = m.floats(rows * classes)?;
        let gw2 = m.floats(hidden * classes)?;
        let gb2 = m.floats(classes)?;
        let d_h = m.floats(rows * hidden)?;
        let d_z1 = m.floats(rows * hidden)?;
        let gw1 = m.floats(inputs * hidden)?;
        let gb1 = m.floats(hidden)?;
        let scale = 1.0 / rows.max(1) as f64;
        let lr = self.lr;
        let (graph, ()) = m.capture(|m| {
            let dev = m.device().clone();
            let (rh, rc) = (rows * hidden, rows * classes);
            // Forward: z1 = x w1 + b1, h = relu(z1), logits = h w2 + b2.
            let ([a, b], mut c) = m.operands([x, p.w1], z1a)?;
            dev.matmul_f32(&a, &b, &mut c, rows, inputs, hidden, false, false)?;
            let ([a, b], mut c) = m.operands([z1a, p.b1], z1)?;
            dev.binary_f32(BinaryOp::Add, &a, rh, &b, hidden, &mut c, rh)?;
            let ([a], mut c) = m.operands([z1], h)?;
            dev.unary_f32(UnaryOp::Relu, &a, &mut c, rh)?;
            let ([a, b], mut c) = m.operands([h, p.w2], la)?;
            dev.matmul_f32(&a, &b, &mut c, rows, hidden, classes, false, false)?;
            let ([a, b], mut c) = m.operands([la, p.b2], logits)?;
            dev.binary_f32(BinaryOp::Add, &a, rc, &b, classes, &mut c, rc)?;
            let ([a], mut c) = m.operands([logits], log_p)?;
            dev.softmax_f32(&a, &mut c, rows, classes, true)?;
            // Loss: -sum(y * log_p) / rows.
            let ([a, b], mut c) = m.operands([y, log_p], t)?;
            dev.binary_f32(BinaryOp::Mul, &a, rc, &b, rc, &mut c, rc)?;
            let ([a], mut c) = m.operands([t], total)?;
            dev.sum_f32(&a, &mut c, 1, rc, 1)?;
            let ([a], mut c) = m.operands([total], loss)?;
            dev.affine_f32(&a, &mut c, 1, (-scale) as f32, 0.0)?;
            // Backward: d_logits = (softmax - y) / rows.
            let ([a], mut c) = m.operands([log_p], prob)?;
            dev.unary_f32(UnaryOp::Exp, &a, &mut c, rc)?;
            let ([a, b], mut c) = m.operands([prob, y], dl0)?;
            dev.binary_f32(BinaryOp::Sub, &a, rc, &b, rc, &mut c, rc)?;
            let ([a], mut c) = m.operands([dl0], d_logits)?;
            dev.affine_f32(&a, &mut c, rc, scale as f32, 0.0)?;
            let ([a, b], mut c) = m.operands([h, d_logits], gw2)?;
            dev.matmul_f32(&a, &b, &mut c, hidden, rows, classes, true, false)?;
            let ([a], mut c) = m.operands([d_logits], gb2)?;
            dev.sum_f32(&a, &mut c, rows, classes, 0)?;
            let ([a, b], mut c) = m.operands([d_logits, p.w2], d_h)?;
            dev.matmul_f32(&a, &b, &mut c, rows, classes, hidden, false, true)?;
            let ([a, b], mut c) = m.operands([z1, d_h], d_z1)?;
            dev.binary_f32(BinaryOp::ReluBackward, &a, rh, &b, rh, &mut c, rh)?;
            let ([a, b], mut c) = m.operands([x, d_z1], gw1)?;
            dev.matmul_f32(&a, &b, &mut c, inputs, rows, hidden, true, false)?;
            let ([a], mut c) = m.operands([d_z1], gb1)?;
            dev.sum_f32(&a, &mut c, rows, hidden, 0)?;
            // SGD: p -= lr * grad.
            for (grad, param, n) in [
                (gw1, p.w1, inputs * hidden),
                (gb1, p.b1, hidden),
                (gw2, p.w2, hidden * classes),
                (gb2, p.b2, classes),
            ] {
                let ([g], mut q) = m.operands([grad], param)?;
                dev.axpy_f32(-lr, &g, &mut q, n)?;
            }
            Ok(())
        })?;
        Ok(Step { graph, x, y, loss })
    }
}
