//! A one-hidden-layer MLP classifier in ndmem tensors (f32): forward pass, softmax
//! cross-entropy, backward pass and an in-place SGD update.
//!
//! Invariant: the arithmetic depends only on the parameter values and the batch, never on
//! where tensors live, so the same seed gives the same bits under every memory mode. A
//! parameter is never the first input of an op (outputs take the first input's
//! placement), so per-batch tensors never land in the parameters' scope.

use ndmem::{Result, Tensor};

use crate::data::Rng;

/// Layer sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    /// Input features.
    pub inputs: usize,
    /// Hidden units (ReLU).
    pub hidden: usize,
    /// Output classes.
    pub classes: usize,
}

impl Dims {
    /// Number of parameters, or `None` if it does not fit a `usize`.
    pub fn parameters(&self) -> Option<usize> {
        let layer = |inputs: usize, outputs: usize| inputs.checked_add(1)?.checked_mul(outputs);
        layer(self.inputs, self.hidden)?.checked_add(layer(self.hidden, self.classes)?)
    }
}

/// Initial parameter values for `dims`: Glorot-uniform weights from `seed`, zero biases;
/// in the order `w1 [inputs, hidden]`, `b1 [hidden]`, `w2 [hidden, classes]`, `b2 [classes]`.
pub fn initial_values(dims: Dims, seed: u64) -> [(Vec<f32>, Vec<usize>); 4] {
    let mut rng = Rng::new(seed ^ 0x1417_0000_0000_0002);
    let mut glorot = |fan_in: usize, fan_out: usize| -> Vec<f32> {
        let bound = (6.0 / (fan_in + fan_out) as f64).sqrt();
        (0..fan_in * fan_out)
            .map(|_| ((rng.next_f64() * 2.0 - 1.0) * bound) as f32)
            .collect()
    };
    [
        (
            glorot(dims.inputs, dims.hidden),
            vec![dims.inputs, dims.hidden],
        ),
        (vec![0.0; dims.hidden], vec![dims.hidden]),
        (
            glorot(dims.hidden, dims.classes),
            vec![dims.hidden, dims.classes],
        ),
        (vec![0.0; dims.classes], vec![dims.classes]),
    ]
}

/// The model's parameters.
#[derive(Debug)]
pub struct Mlp {
    /// Input-to-hidden weights `[inputs, hidden]`.
    pub w1: Tensor,
    /// Hidden biases `[hidden]`.
    pub b1: Tensor,
    /// Hidden-to-output weights `[hidden, classes]`.
    pub w2: Tensor,
    /// Output biases `[classes]`.
    pub b2: Tensor,
}

/// Gradients of the loss, one per parameter.
#[derive(Debug)]
pub struct Grads {
    /// d loss / d w1.
    pub w1: Tensor,
    /// d loss / d b1.
    pub b1: Tensor,
    /// d loss / d w2.
    pub w2: Tensor,
    /// d loss / d b2.
    pub b2: Tensor,
}

impl Grads {
    /// The gradients copied into the parent of the current workspace (detached if there
    /// is none), so they outlive the current cycle.
    pub fn leverage(&self) -> Result<Grads> {
        Ok(Grads {
            w1: self.w1.leverage()?,
            b1: self.b1.leverage()?,
            w2: self.w2.leverage()?,
            b2: self.b2.leverage()?,
        })
    }
}

impl Mlp {
    /// Parameters with [`initial_values`], each made into a tensor by `make` (which decides
    /// where they live).
    pub fn new(
        dims: Dims,
        seed: u64,
        mut make: impl FnMut(&[f32], &[usize]) -> Result<Tensor>,
    ) -> Result<Mlp> {
        let [w1, b1, w2, b2] = initial_values(dims, seed);
        Ok(Mlp {
            w1: make(&w1.0, &w1.1)?,
            b1: make(&b1.0, &b1.1)?,
            w2: make(&w2.0, &w2.1)?,
            b2: make(&b2.0, &b2.1)?,
        })
    }

    /// Hidden pre-activations and output logits for a batch `x [rows, inputs]`.
    fn forward(&self, x: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let z1 = x.matmul(&self.w1)?.add(&self.b1)?;
        let h = z1.relu()?;
        let logits = h.matmul(&self.w2)?.add(&self.b2)?;
        Ok((z1, h, logits))
    }

    /// Mean softmax cross-entropy of a batch against one-hot targets `y [rows, classes]`,
    /// and its gradients.
    pub fn loss_and_grads(&self, x: &Tensor, y: &Tensor) -> Result<(f32, Grads)> {
        let rows = x.shape()[0].max(1) as f64;
        let (z1, h, logits) = self.forward(x)?;
        let log_p = logits.log_softmax(1)?;
        let loss = y.mul(&log_p)?.sum()?.mul_scalar(-1.0 / rows)?.scalar()? as f32;
        // d loss / d logits = (softmax - y) / rows.
        let d_logits = log_p.exp()?.sub(y)?.mul_scalar(1.0 / rows)?;
        let w2 = h.transpose()?.matmul(&d_logits)?;
        let b2 = d_logits.sum_axis(0)?;
        let d_h = d_logits.matmul(&self.w2.transpose()?)?;
        let d_z1 = z1.relu_backward(&d_h)?;
        let w1 = x.transpose()?.matmul(&d_z1)?;
        let b1 = d_z1.sum_axis(0)?;
        Ok((loss, Grads { w1, b1, w2, b2 }))
    }

    /// `p -= lr * grad` for every parameter, in place (no allocation).
    pub fn sgd(&mut self, grads: &Grads, lr: f32) -> Result<()> {
        let alpha = -f64::from(lr);
        self.w1.scaled_add(alpha, &grads.w1)?;
        self.b1.scaled_add(alpha, &grads.b1)?;
        self.w2.scaled_add(alpha, &grads.w2)?;
        self.b2.scaled_add(alpha, &grads.b2)?;
        Ok(())
    }

    /// The predicted class of each row of `x`.
    pub fn predict(&self, x: &Tensor) -> Result<Vec<i64>> {
        let (_, _, logits) = self.forward(x)?;
        logits.argmax(1)?.to_vec::<i64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndmem::DType;

    fn dims() -> Dims {
        Dims {
            inputs: 3,
            hidden: 5,
            classes: 2,
        }
    }

    /// The loss as plain f64 arithmetic, for finite differences.
    fn loss_f64(p: &[Vec<f32>; 4], x: &[f32], y: &[f32], d: Dims) -> f64 {
        let rows = x.len() / d.inputs;
        let mut total = 0.0;
        for r in 0..rows {
            let h: Vec<f64> = (0..d.hidden)
                .map(|j| {
                    let z: f64 = (0..d.inputs)
                        .map(|i| f64::from(x[r * d.inputs + i]) * f64::from(p[0][i * d.hidden + j]))
                        .sum::<f64>()
                        + f64::from(p[1][j]);
                    z.max(0.0)
                })
                .collect();
            let logits: Vec<f64> = (0..d.classes)
                .map(|k| {
                    (0..d.hidden)
                        .map(|j| h[j] * f64::from(p[2][j * d.classes + k]))
                        .sum::<f64>()
                        + f64::from(p[3][k])
                })
                .collect();
            let max = logits.iter().cloned().fold(f64::MIN, f64::max);
            let lse = max + logits.iter().map(|l| (l - max).exp()).sum::<f64>().ln();
            for k in 0..d.classes {
                total -= f64::from(y[r * d.classes + k]) * (logits[k] - lse);
            }
        }
        total / rows as f64
    }

    #[test]
    fn gradients_match_finite_differences() {
        let d = dims();
        let init = initial_values(d, 3);
        let mut values: [Vec<f32>; 4] = init.clone().map(|(v, _)| v);
        // Non-zero biases so every path is exercised.
        values[1] = vec![0.1, -0.2, 0.3, 0.05, -0.1];
        values[3] = vec![0.2, -0.1];
        let shapes: Vec<Vec<usize>> = init.iter().map(|(_, s)| s.clone()).collect();
        let mut k = 0;
        let model = Mlp::new(d, 3, |_, shape| {
            let t = Tensor::from_slice(&values[k], shape);
            k += 1;
            t
        })
        .unwrap();
        let x = [0.5f32, -1.0, 2.0, 1.5, 0.25, -0.75];
        let y = [1.0f32, 0.0, 0.0, 1.0];
        let xt = Tensor::from_slice(&x, &[2, 3]).unwrap();
        let yt = Tensor::from_slice(&y, &[2, 2]).unwrap();
        let (loss, grads) = model.loss_and_grads(&xt, &yt).unwrap();
        assert!((f64::from(loss) - loss_f64(&values, &x, &y, d)).abs() < 1e-5);
        let analytic = [&grads.w1, &grads.b1, &grads.w2, &grads.b2];
        for (p, grad) in analytic.iter().enumerate() {
            assert_eq!(grad.shape(), shapes[p].as_slice());
            let g = grad.to_vec::<f32>().unwrap();
            for i in 0..values[p].len() {
                let eps = 1e-3f32;
                let mut plus = values.clone();
                plus[p][i] += eps;
                let mut minus = values.clone();
                minus[p][i] -= eps;
                let numeric = (loss_f64(&plus, &x, &y, d) - loss_f64(&minus, &x, &y, d))
                    / (2.0 * f64::from(eps));
                assert!(
                    (numeric - f64::from(g[i])).abs() < 2e-3,
                    "param {p}[{i}]: numeric {numeric} analytic {}",
                    g[i]
                );
            }
        }
    }

    #[test]
    fn parameter_count_is_checked() {
        assert_eq!(dims().parameters(), Some(4 * 5 + 6 * 2));
        let huge = Dims {
            hidden: usize::MAX,
            ..dims()
        };
        assert_eq!(huge.parameters(), None);
    }

    #[test]
    fn sgd_updates_in_place_and_lowers_the_loss() {
        let d = dims();
        let mut model = Mlp::new(d, 1, Tensor::from_slice).unwrap();
        let x = Tensor::rand(DType::F32, &[8, 3], 5).unwrap();
        let y = Tensor::from_slice(&[1.0f32, 0.0].repeat(8), &[8, 2]).unwrap();
        let (first, grads) = model.loss_and_grads(&x, &y).unwrap();
        model.sgd(&grads, 0.5).unwrap();
        let (second, _) = model.loss_and_grads(&x, &y).unwrap();
        assert!(second < first, "{second} >= {first}");
        assert_eq!(model.predict(&x).unwrap().len(), 8);
    }
}
