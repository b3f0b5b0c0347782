//! The three memory modes a training step runs under, and the [`Trainer`] that keeps the
//! model's parameters where its mode wants them.
//!
//! - `pool`: no workspace, no scope. Every op output is a pool block owned by its handles,
//!   freed through epoch reclamation when the last handle drops.
//! - `workspaces`: each step is one cycle of a FirstLoop workspace for its batch and
//!   activations, nested in a cycle of a parent workspace that receives the gradients
//!   (copied there with `leverage`, as ND4J does). The inner cycle ends before the SGD
//!   update, so the step's activations are gone while the update reads the gradients.
//!   Parameters are detached pool tensors updated in place, so once the first cycle has
//!   learned both workspaces' sizes a step takes nothing from the pool.
//! - `scopes`: each step opens a child scope that owns the batch and every tensor derived
//!   from it, and closes it at the end; the parameters belong to a base scope.
//!
//! Invariant: a step does the same arithmetic in every mode (see `model`); only placement
//! differs, so the loss curves agree bit for bit.

use ndmem::device::Device;
use ndmem::{reclaim, workspaces, Result, Scope, Tensor, WorkspaceConfig, WorkspaceGuard};

use crate::model::{Dims, Mlp};

/// Id of the workspace a training step runs in.
pub const STEP_WORKSPACE: &str = "TRAIN_STEP";
/// Id of the parent workspace a training step's gradients live in.
pub const GRAD_WORKSPACE: &str = "GRADIENTS";
/// Id of the workspace evaluation runs in.
pub const EVAL_WORKSPACE: &str = "EVAL";

/// Where a step's tensors live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Pool blocks owned by their handles.
    Pool,
    /// A cyclic workspace per step.
    Workspaces,
    /// A child scope per step.
    Scopes,
}

impl Mode {
    /// Every mode, in the order they run.
    pub const ALL: [Mode; 3] = [Mode::Pool, Mode::Workspaces, Mode::Scopes];

    /// The mode's name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Pool => "pool",
            Mode::Workspaces => "workspaces",
            Mode::Scopes => "scopes",
        }
    }

    /// One line on what the mode does (at most 66 characters, so a header line with the
    /// mode's name fits 80 columns).
    pub fn describe(self) -> &'static str {
        match self {
            Mode::Pool => "every tensor a pool block, freed when its last handle drops",
            Mode::Workspaces => "a FirstLoop workspace cycle per step, gradients in a parent one",
            Mode::Scopes => "a child scope per step, closed at its end; weights in a base scope",
        }
    }
}

/// A step's batch: host rows, or tensors already placed.
#[derive(Clone, Copy)]
enum Inputs<'a> {
    /// Features and one-hot targets, row-major.
    Host(&'a [f32], &'a [f32]),
    /// Features and targets as tensors (on the trainer's device, if it has one).
    Placed(&'a Tensor, &'a Tensor),
}

/// A model and the memory discipline its steps follow.
#[derive(Debug)]
pub struct Trainer {
    /// Where the step's tensors live.
    mode: Mode,
    /// Layer sizes, for the batch tensors' shapes.
    dims: Dims,
    /// The parameters: pool tensors, or tensors of `base` in `scopes` mode.
    model: Mlp,
    /// The scope owning the parameters (`scopes` mode).
    base: Option<Scope>,
    /// Configuration of the step and evaluation workspaces (`workspaces` mode).
    config: WorkspaceConfig,
    /// The device the parameters live on, if any: each step copies its batch there.
    device: Option<Device>,
}

impl Trainer {
    /// A freshly initialised model (same values for the same seed in every mode).
    pub fn new(mode: Mode, dims: Dims, seed: u64) -> Result<Trainer> {
        // Parameters go to the pool (or the base scope), whatever workspace is current.
        let _out = workspaces().scope_out();
        let base = (mode == Mode::Scopes).then(|| Scope::new_base("parameters"));
        let model = match &base {
            Some(scope) => Mlp::new(dims, seed, |v, s| scope.from_slice(v, s))?,
            None => Mlp::new(dims, seed, Tensor::from_slice)?,
        };
        Ok(Trainer {
            mode,
            dims,
            model,
            base,
            config: WorkspaceConfig::default(),
            device: None,
        })
    }

    /// The same trainer with its parameters on `device`: its steps run there, copying
    /// only their batch in and their loss out (semantics §5.8).
    pub fn on_device(mut self, device: &Device) -> Result<Trainer> {
        let m = &self.model;
        self.model = Mlp {
            w1: m.w1.to_device(device)?,
            b1: m.b1.to_device(device)?,
            w2: m.w2.to_device(device)?,
            b2: m.b2.to_device(device)?,
        };
        self.device = Some(device.clone());
        Ok(self)
    }

    /// `t` on the trainer's device, or `t` itself without one.
    fn placed(&self, t: Tensor) -> Result<Tensor> {
        match &self.device {
            Some(device) => t.to_device(device),
            None => Ok(t),
        }
    }

    /// One SGD step on a batch of `x.len() / inputs` rows with one-hot targets `y`;
    /// returns the batch's loss before the update.
    pub fn step(&mut self, x: &[f32], y: &[f32], lr: f32) -> Result<f32> {
        self.step_on(Inputs::Host(x, y), lr)
    }

    /// [`Trainer::step`] on a batch that is already on the trainer's device (copied there
    /// ahead of the step, by a prefetching producer): the same arithmetic, without the copy
    /// in. Tensors on no device or another one are copied to the trainer's device first.
    pub fn step_on_device(&mut self, x: &Tensor, y: &Tensor, lr: f32) -> Result<f32> {
        self.step_on(Inputs::Placed(x, y), lr)
    }

    /// The batch as step tensors on the trainer's device, created in `scope` if it comes
    /// from host slices and one is given.
    fn inputs(&self, inputs: Inputs<'_>, scope: Option<&Scope>) -> Result<(Tensor, Tensor)> {
        match inputs {
            Inputs::Host(x, y) => {
                let rows = x.len() / self.dims.inputs;
                let (x_shape, y_shape) = ([rows, self.dims.inputs], [rows, self.dims.classes]);
                let make = |v: &[f32], shape: &[usize]| match scope {
                    Some(scope) => scope.from_slice(v, shape),
                    None => Tensor::from_slice(v, shape),
                };
                Ok((
                    self.placed(make(x, &x_shape)?)?,
                    self.placed(make(y, &y_shape)?)?,
                ))
            }
            Inputs::Placed(x, y) => Ok((self.placed(x.clone())?, self.placed(y.clone())?)),
        }
    }

    fn step_on(&mut self, inputs: Inputs<'_>, lr: f32) -> Result<f32> {
        if self.mode == Mode::Scopes {
            let base = self.base.as_ref().expect("scopes mode has a base scope");
            let batch = base.child("batch")?;
            let loss = {
                let (x, y) = self.inputs(inputs, Some(&batch))?;
                let (loss, grads) = self.model.loss_and_grads(&x, &y)?;
                self.model.sgd(&grads, lr)?;
                loss
            };
            batch.close()?;
            return Ok(loss);
        }
        // `pool` and `workspaces` differ only in the cycles around the step: in
        // `workspaces`, gradients go to the parent cycle before the inner one ends.
        let _grad_cycle = self.cycle(GRAD_WORKSPACE)?;
        let (loss, grads) = {
            let step_cycle = self.cycle(STEP_WORKSPACE)?;
            let (x, y) = self.inputs(inputs, None)?;
            let (loss, grads) = self.model.loss_and_grads(&x, &y)?;
            // Device gradients live in the device pool, not in the cycle: nothing to move.
            match step_cycle {
                Some(_) if self.device.is_none() => (loss, grads.leverage()?),
                _ => (loss, grads),
            }
        }; // the step cycle ends here, after its batch, activations and gradients dropped
        self.model.sgd(&grads, lr)?;
        Ok(loss)
    }

    /// A cycle of workspace `id` in `workspaces` mode; `None` in the other modes.
    fn cycle(&self, id: &str) -> Result<Option<WorkspaceGuard>> {
        match self.mode {
            Mode::Workspaces => Ok(Some(workspaces().get_and_activate(&self.config, id)?)),
            Mode::Pool | Mode::Scopes => Ok(None),
        }
    }

    /// Gives back what training steps hold between steps: the step and gradient
    /// workspaces (`workspaces` mode) and the frees still deferred by epoch reclamation.
    /// Evaluation calls it first, so it never needs room beside them: a larger limit can
    /// never fail where a smaller one succeeds because a learned workspace grew into it.
    /// The next step learns the workspaces again.
    pub fn release_step_memory(&self) -> Result<()> {
        if self.mode == Mode::Workspaces {
            let ws = workspaces();
            for id in [STEP_WORKSPACE, GRAD_WORKSPACE] {
                if ws.exists(id) {
                    ws.destroy(id)?;
                }
            }
        }
        reclaim::collect();
        Ok(())
    }

    /// Fraction of rows of `x` whose predicted class is `labels[i]`, computed under the
    /// mode's discipline (its own workspace or child scope), after
    /// [`Trainer::release_step_memory`].
    pub fn accuracy(&self, x: &[f32], labels: &[usize]) -> Result<f64> {
        self.release_step_memory()?;
        let rows = labels.len();
        let shape = [rows, self.dims.inputs];
        let predicted = match self.mode {
            Mode::Pool => self
                .model
                .predict(&self.placed(Tensor::from_slice(x, &shape)?)?)?,
            Mode::Workspaces => {
                let ws = workspaces();
                let predicted = {
                    let _cycle = ws.get_and_activate(&self.config, EVAL_WORKSPACE)?;
                    self.model
                        .predict(&self.placed(Tensor::from_slice(x, &shape)?)?)?
                };
                ws.destroy(EVAL_WORKSPACE)?;
                predicted
            }
            Mode::Scopes => {
                let base = self.base.as_ref().expect("scopes mode has a base scope");
                let eval = base.child("eval")?;
                let predicted = self
                    .model
                    .predict(&self.placed(eval.from_slice(x, &shape)?)?)?;
                eval.close()?;
                predicted
            }
        };
        let correct = predicted
            .iter()
            .zip(labels)
            .filter(|(p, l)| usize::try_from(**p).is_ok_and(|p| p == **l))
            .count();
        Ok(correct as f64 / rows.max(1) as f64)
    }
}

impl Drop for Trainer {
    fn drop(&mut self) {
        if self.mode == Mode::Workspaces {
            // Gives the learned buffers back; absent if the first step failed early.
            let _ = workspaces().destroy(STEP_WORKSPACE);
            let _ = workspaces().destroy(GRAD_WORKSPACE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIMS: Dims = Dims {
        inputs: 4,
        hidden: 8,
        classes: 3,
    };

    fn batch(step: usize) -> (Vec<f32>, Vec<f32>) {
        let x = (0..16 * 4)
            .map(|i| ((i + step) as f32 * 0.37).sin())
            .collect();
        let y = (0..16)
            .flat_map(|r| (0..3).map(move |c| f32::from(u8::from((r + step) % 3 == c))))
            .collect();
        (x, y)
    }

    #[test]
    fn every_mode_computes_the_same_bits() {
        let mut curves = Vec::new();
        for mode in Mode::ALL {
            let mut trainer = Trainer::new(mode, DIMS, 11).unwrap();
            let curve: Vec<u32> = (0..5)
                .map(|s| {
                    let (x, y) = batch(s);
                    trainer.step(&x, &y, 0.1).unwrap().to_bits()
                })
                .collect();
            curves.push(curve);
        }
        assert_eq!(curves[0], curves[1]);
        assert_eq!(curves[0], curves[2]);
    }
}
