//! The training data: Fisher's Iris flowers (1936), embedded from `data/iris.csv`, with a
//! stratified train/test split, per-epoch shuffles and feature standardisation.
//!
//! Invariant: everything here is a pure function of the CSV text and the seed, so every
//! memory mode sees the same batches in the same order, and host buffers are filled in
//! place (a batch allocates nothing once its buffers have their capacity).

/// The embedded CSV: a header line, then `sepal_length,sepal_width,petal_length,petal_width,species`.
pub const IRIS_CSV: &str = include_str!("../../data/iris.csv");

/// Species names, in label order.
pub const CLASSES: [&str; 3] = ["setosa", "versicolor", "virginica"];

/// Measurements per flower.
pub const FEATURES: usize = 4;

/// Fraction of each class held out for testing.
pub const TEST_FRACTION: f64 = 0.2;

/// Rows of features (row-major, [`FEATURES`] per row) and their class labels.
#[derive(Debug, Clone, Default)]
pub struct Dataset {
    /// `rows x FEATURES` values, row-major.
    pub features: Vec<f32>,
    /// One label (an index into [`CLASSES`]) per row.
    pub labels: Vec<usize>,
}

impl Dataset {
    /// The Iris data.
    pub fn iris() -> Result<Dataset, String> {
        Dataset::parse(IRIS_CSV)
    }

    /// Parses the CSV format of [`IRIS_CSV`]; errors name the line.
    pub fn parse(csv: &str) -> Result<Dataset, String> {
        let mut data = Dataset::default();
        for (number, line) in csv.lines().enumerate().skip(1) {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split(',').collect();
            if fields.len() != FEATURES + 1 {
                return Err(format!(
                    "iris.csv line {}: expected {} fields, found {}",
                    number + 1,
                    FEATURES + 1,
                    fields.len()
                ));
            }
            for field in &fields[..FEATURES] {
                let value: f32 = field.trim().parse().map_err(|_| {
                    format!("iris.csv line {}: {field:?} is not a number", number + 1)
                })?;
                data.features.push(value);
            }
            let species = fields[FEATURES].trim();
            let label = CLASSES.iter().position(|c| *c == species).ok_or_else(|| {
                format!("iris.csv line {}: unknown species {species:?}", number + 1)
            })?;
            data.labels.push(label);
        }
        if data.labels.is_empty() {
            return Err("iris.csv holds no rows".into());
        }
        Ok(data)
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.labels.len()
    }

    /// The features of row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.features[i * FEATURES..(i + 1) * FEATURES]
    }

    /// Appends row `i` of `from` (features and label).
    fn push_row(&mut self, from: &Dataset, i: usize) {
        self.features.extend_from_slice(from.row(i));
        self.labels.push(from.labels[i]);
    }
}

/// Training and test rows.
#[derive(Debug, Clone)]
pub struct Split {
    /// Rows to train on.
    pub train: Dataset,
    /// Rows held out.
    pub test: Dataset,
}

impl Split {
    /// A stratified split: [`TEST_FRACTION`] of each class, chosen by `seed`, is held out;
    /// then the features are standardised with the training rows' mean and deviation.
    pub fn new(data: &Dataset, seed: u64) -> Split {
        let mut rng = Rng::new(seed ^ 0x5eed_0000_0000_0001);
        let mut split = Split {
            train: Dataset::default(),
            test: Dataset::default(),
        };
        for class in 0..CLASSES.len() {
            let mut rows: Vec<usize> = (0..data.rows())
                .filter(|&i| data.labels[i] == class)
                .collect();
            rng.shuffle(&mut rows);
            let held_out = (rows.len() as f64 * TEST_FRACTION).round() as usize;
            for (k, &i) in rows.iter().enumerate() {
                let side = if k < held_out {
                    &mut split.test
                } else {
                    &mut split.train
                };
                side.push_row(data, i);
            }
        }
        split.standardise();
        split
    }

    /// Scales every feature to mean 0 and deviation 1 over the training rows (the test
    /// rows get the same transform, so nothing about them leaks into training).
    fn standardise(&mut self) {
        let n = self.train.rows().max(1) as f64;
        for f in 0..FEATURES {
            let column = || self.train.features.iter().skip(f).step_by(FEATURES);
            let mean = column().map(|v| f64::from(*v)).sum::<f64>() / n;
            let var = column()
                .map(|v| (f64::from(*v) - mean).powi(2))
                .sum::<f64>()
                / n;
            let scale = if var > 0.0 { 1.0 / var.sqrt() } else { 1.0 };
            for set in [&mut self.train, &mut self.test] {
                for v in set.features.iter_mut().skip(f).step_by(FEATURES) {
                    *v = ((f64::from(*v) - mean) * scale) as f32;
                }
            }
        }
    }
}

/// Fills `x` with the features and `y` with the one-hot labels of `rows` (cleared first,
/// so buffers with enough capacity are reused without allocating).
pub fn fill_batch(data: &Dataset, rows: &[usize], x: &mut Vec<f32>, y: &mut Vec<f32>) {
    x.clear();
    y.clear();
    for &i in rows {
        x.extend_from_slice(data.row(i));
        let label = data.labels[i];
        y.extend((0..CLASSES.len()).map(|c| if c == label { 1.0 } else { 0.0 }));
    }
}

/// The generator of the per-epoch shuffles of the training rows for `seed` (distinct from
/// the split's and the initial weights' streams).
pub fn shuffler(seed: u64) -> Rng {
    Rng::new(seed ^ 0x0e90_c400_0000_0003)
}

/// SplitMix64: a small, fast, well-mixed generator; the same seed gives the same stream
/// on every platform.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (`n > 0`), without modulo bias worth mentioning at these sizes.
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iris_parses_to_150_rows_of_three_balanced_classes() {
        let data = Dataset::iris().unwrap();
        assert_eq!(data.rows(), 150);
        assert_eq!(data.features.len(), 150 * FEATURES);
        for class in 0..3 {
            assert_eq!(data.labels.iter().filter(|&&l| l == class).count(), 50);
        }
        assert_eq!(data.row(0), &[5.1, 3.5, 1.4, 0.2]);
    }

    #[test]
    fn split_is_stratified_standardised_and_seeded() {
        let data = Dataset::iris().unwrap();
        let a = Split::new(&data, 7);
        assert_eq!((a.train.rows(), a.test.rows()), (120, 30));
        for class in 0..3 {
            assert_eq!(a.test.labels.iter().filter(|&&l| l == class).count(), 10);
        }
        for f in 0..FEATURES {
            let col: Vec<f64> = a
                .train
                .features
                .iter()
                .skip(f)
                .step_by(FEATURES)
                .map(|v| f64::from(*v))
                .collect();
            let mean = col.iter().sum::<f64>() / col.len() as f64;
            let var = col.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / col.len() as f64;
            assert!(
                mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-4,
                "feature {f}: {mean} {var}"
            );
        }
        let b = Split::new(&data, 7);
        assert_eq!(a.test.features, b.test.features);
        let c = Split::new(&data, 8);
        assert_ne!(a.test.features, c.test.features);
    }

    #[test]
    fn bad_csv_names_the_line() {
        let err = Dataset::parse("h\n1,2,3,4,setosa\n1,2,x,4,setosa\n").unwrap_err();
        assert!(err.contains("line 3"), "{err}");
        let err = Dataset::parse("h\n1,2,3,4,rose\n").unwrap_err();
        assert!(err.contains("rose"), "{err}");
    }

    #[test]
    fn batches_are_one_hot_and_reuse_their_buffers() {
        let data = Dataset::iris().unwrap();
        let (mut x, mut y) = (Vec::with_capacity(64), Vec::with_capacity(48));
        fill_batch(&data, &[0, 149], &mut x, &mut y);
        assert_eq!(y, vec![1.0, 0.0, 0.0, 0.0, 0.0, 1.0]);
        assert_eq!(&x[..4], data.row(0));
        let capacity = x.capacity();
        fill_batch(&data, &[1, 2, 3], &mut x, &mut y);
        assert_eq!((x.len(), x.capacity()), (12, capacity));
    }
}
