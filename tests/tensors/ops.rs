//! Tensor ops give plain ndarray's results (f32 and f64, broadcasting, transposed inputs),
//! and shape and dtype mismatches are errors (semantics §3 for checked access).

use ndarray::{array, Array2, ArrayD, Axis, IxDyn};
use ndmem::{DType, Error, Tensor};

fn arr<T: ndmem::Element>(t: &Tensor) -> ArrayD<T> {
    ArrayD::from_shape_vec(IxDyn(t.shape()), t.to_vec::<T>().unwrap()).unwrap()
}

fn close(a: &ArrayD<f64>, b: &ArrayD<f64>) {
    assert_eq!(a.shape(), b.shape());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-12 * (1.0 + y.abs()), "{a} != {b}");
    }
}

#[test]
fn elementwise_ops_match_ndarray_with_broadcasting_f64() {
    let a = array![[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]].into_dyn();
    let b = array![10.0, 20.0, 30.0].into_dyn();
    let ta = Tensor::from_slice(a.as_slice().unwrap(), &[2, 3]).unwrap();
    let tb = Tensor::from_slice(b.as_slice().unwrap(), &[3]).unwrap();
    close(&arr(&ta.add(&tb).unwrap()), &(&a + &b));
    close(&arr(&ta.sub(&tb).unwrap()), &(&a - &b));
    close(&arr(&ta.mul(&tb).unwrap()), &(&a * &b));
    close(&arr(&ta.div(&tb).unwrap()), &(&a / &b));
    close(&arr(&tb.sub(&ta).unwrap()), &(&b - &a));
    close(&arr(&ta.add_scalar(1.5).unwrap()), &(&a + 1.5));
    close(&arr(&ta.mul_scalar(-2.0).unwrap()), &(&a * -2.0));
    let col = Tensor::from_slice(&[1.0, 2.0], &[2, 1]).unwrap();
    close(
        &arr(&ta.add(&col).unwrap()),
        &(&a + &array![[1.0], [2.0]].into_dyn()),
    );
}

#[test]
fn unary_ops_match_ndarray_f32() {
    let data = [-2.0f32, -0.5, 0.0, 0.25, 1.0, 3.0];
    let a = ArrayD::from_shape_vec(IxDyn(&[2, 3]), data.to_vec()).unwrap();
    let t = Tensor::from_slice(&data, &[2, 3]).unwrap();
    assert_eq!(arr::<f32>(&t.relu().unwrap()), a.mapv(|x| x.max(0.0)));
    assert_eq!(arr::<f32>(&t.tanh().unwrap()), a.mapv(f32::tanh));
    assert_eq!(arr::<f32>(&t.exp().unwrap()), a.mapv(f32::exp));
    assert_eq!(
        arr::<f32>(&t.sigmoid().unwrap()),
        a.mapv(|x| 1.0 / (1.0 + (-x).exp()))
    );
    let pos = t.exp().unwrap();
    assert_eq!(
        arr::<f32>(&pos.log().unwrap()),
        a.mapv(f32::exp).mapv(f32::ln)
    );
}

#[test]
fn matmul_matches_ndarray_including_transposed_inputs() {
    let a = Array2::from_shape_fn((3, 4), |(i, j)| (i * 4 + j) as f64 * 0.5 - 2.0);
    let b = Array2::from_shape_fn((4, 2), |(i, j)| (i as f64 + 1.0) / (j as f64 + 2.0));
    let ta = Tensor::from_slice(a.as_slice().unwrap(), &[3, 4]).unwrap();
    let tb = Tensor::from_slice(b.as_slice().unwrap(), &[4, 2]).unwrap();
    close(&arr(&ta.matmul(&tb).unwrap()), &a.dot(&b).into_dyn());
    // a^T a: the transposed view is non-contiguous.
    let tat = ta.transpose().unwrap();
    assert_eq!(tat.shape(), &[4, 3]);
    close(&arr(&tat.matmul(&ta).unwrap()), &a.t().dot(&a).into_dyn());
    // Elementwise on a transposed view.
    close(
        &arr(&tat.add_scalar(1.0).unwrap()),
        &(&a.t().to_owned() + 1.0).into_dyn(),
    );
    let af = a.mapv(|x| x as f32);
    let taf = Tensor::from_slice(af.as_slice().unwrap(), &[3, 4]).unwrap();
    let got = arr::<f32>(&taf.matmul(&taf.transpose().unwrap()).unwrap());
    assert_eq!(got, af.dot(&af.t()).into_dyn());
}

#[test]
fn reductions_and_softmax_match_ndarray() {
    let a = Array2::from_shape_fn((3, 5), |(i, j)| ((i * 5 + j) as f64).sin()).into_dyn();
    let t = Tensor::from_slice(a.as_slice().unwrap(), &[3, 5]).unwrap();
    close(&arr(&t.sum_axis(0).unwrap()), &a.sum_axis(Axis(0)));
    close(&arr(&t.sum_axis(1).unwrap()), &a.sum_axis(Axis(1)));
    close(
        &arr(&t.mean_axis(1).unwrap()),
        &a.mean_axis(Axis(1)).unwrap(),
    );
    assert!((t.sum().unwrap().scalar().unwrap() - a.sum()).abs() < 1e-12);
    assert!((t.mean().unwrap().scalar().unwrap() - a.mean().unwrap()).abs() < 1e-12);
    let s = arr::<f64>(&t.softmax(1).unwrap());
    let e = a.mapv(f64::exp);
    let expected = &e / &e.sum_axis(Axis(1)).insert_axis(Axis(1));
    close(&s, &expected);
    // Softmax of a transposed view along axis 0 equals the transpose of softmax along 1.
    let st = arr::<f64>(&t.transpose().unwrap().softmax(0).unwrap());
    close(&st, &expected.t().to_owned());
    let am = t.argmax(1).unwrap();
    assert_eq!(am.dtype(), DType::I64);
    let expected_am: Vec<i64> = a
        .lanes(Axis(1))
        .into_iter()
        .map(|l| {
            l.iter()
                .enumerate()
                .fold(
                    (0, f64::MIN),
                    |b, (i, v)| if *v > b.1 { (i, *v) } else { b },
                )
                .0 as i64
        })
        .collect();
    assert_eq!(am.to_vec::<i64>().unwrap(), expected_am);
}

#[test]
fn views_reshape_and_broadcast_share_memory() {
    let t = Tensor::from_slice(&[1i32, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
    let r = t.reshape(&[3, 2]).unwrap();
    assert!(r.shares_storage(&t));
    assert_eq!(r.to_vec::<i32>().unwrap(), vec![1, 2, 3, 4, 5, 6]);
    let tt = t.transpose().unwrap();
    assert!(tt.shares_storage(&t));
    assert_eq!(tt.to_vec::<i32>().unwrap(), vec![1, 4, 2, 5, 3, 6]);
    let flat = tt.reshape(&[6]).unwrap();
    assert!(!flat.shares_storage(&t), "a non-contiguous reshape copies");
    assert_eq!(flat.to_vec::<i32>().unwrap(), vec![1, 4, 2, 5, 3, 6]);
    let row = Tensor::from_slice(&[7i32, 8, 9], &[3]).unwrap();
    let b = row.broadcast_to(&[2, 3]).unwrap();
    assert!(b.shares_storage(&row));
    assert_eq!(b.to_vec::<i32>().unwrap(), vec![7, 8, 9, 7, 8, 9]);
    assert_eq!(
        b.add(&t).unwrap().to_vec::<i32>().unwrap(),
        vec![8, 10, 12, 11, 13, 15]
    );
    let view = t.view::<i32>().unwrap();
    assert_eq!(view[[1, 2]], 6);
    assert_eq!((view.len(), view.ndim(), view.is_empty()), (6, 2, false));
    let owned = view.to_owned();
    drop(view);
    drop(t);
    assert_eq!(owned.shape(), &[2, 3]);
    assert_eq!(owned[[1, 2]], 6);
}

#[test]
fn a_view_reads_like_the_ndarray_view_it_wraps() {
    let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let view = t.view::<f32>().unwrap();
    assert_eq!(view, array![[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]]);
    assert_ne!(
        view,
        array![[1.0f32, 2.0], [3.0, 4.0], [5.0, 6.0]],
        "shape differs"
    );
    assert_ne!(
        view,
        array![[1.0f32, 2.0, 3.0], [4.0, 5.0, 7.0]],
        "an element differs"
    );
    assert_eq!(
        view.as_slice(),
        Some(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0][..])
    );
    assert_eq!(view.to_vec(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!((view.first(), view.mean()), (Some(&1.0), Some(3.5)));
    assert_eq!(view.strides(), &[3, 1]);
    assert_eq!((&view).into_iter().copied().sum::<f32>(), 21.0);
    assert_eq!(view, t.view::<f32>().unwrap());

    // A transposed tensor is a view with other strides: no slice, the same elements.
    let tt = t.transpose().unwrap();
    let tv = tt.view::<f32>().unwrap();
    assert_eq!(tv.as_slice(), None);
    assert_eq!(tv.strides(), &[1, 3]);
    assert_eq!(tv.to_vec(), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    assert_eq!(tv, array![[1.0f32, 4.0], [2.0, 5.0], [3.0, 6.0]]);
    assert_ne!(tv, view);

    let empty = Tensor::zeros(DType::I32, &[0, 2]).unwrap();
    let ev = empty.view::<i32>().unwrap();
    assert_eq!((ev.mean(), ev.first(), ev.to_vec()), (None, None, vec![]));
    let ints = Tensor::from_slice(&[1i32, 2, 4], &[3]).unwrap();
    assert_eq!(
        ints.view::<i32>().unwrap().mean(),
        Some(2),
        "integer mean truncates"
    );
    // An integer mean neither wraps in its sum nor saturates its count: as Tensor::mean.
    let bytes = Tensor::from_slice(&[200u8, 200], &[2]).unwrap();
    assert_eq!(bytes.view::<u8>().unwrap().mean(), Some(200));
    let many = Tensor::from_slice(&[10u8; 300], &[300]).unwrap();
    assert_eq!(many.view::<u8>().unwrap().mean(), Some(10));
    let big = Tensor::from_slice(&[i32::MAX, i32::MAX], &[2]).unwrap();
    assert_eq!(big.view::<i32>().unwrap().mean(), Some(i32::MAX));
    assert_eq!(big.mean().unwrap().scalar().unwrap(), f64::from(i32::MAX));
}

#[test]
fn creation_functions_fill_as_documented() {
    assert_eq!(
        Tensor::zeros(DType::U8, &[3])
            .unwrap()
            .to_vec::<u8>()
            .unwrap(),
        vec![0; 3]
    );
    assert_eq!(
        Tensor::ones(DType::I64, &[2])
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![1; 2]
    );
    assert_eq!(
        Tensor::full(DType::F32, &[2, 2], 2.5)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![2.5; 4]
    );
    let r1 = Tensor::rand(DType::F64, &[100], 7)
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    let r2 = Tensor::rand(DType::F64, &[100], 7)
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    let r3 = Tensor::rand(DType::F64, &[100], 8)
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    assert_eq!(r1, r2, "same seed, same values");
    assert_ne!(r1, r3);
    assert!(r1.iter().all(|v| (0.0..1.0).contains(v)));
    let v = Tensor::from_vec(vec![1.0f32, 2.0], &[2, 1]).unwrap();
    assert_eq!(v.shape(), &[2, 1]);
    let empty = Tensor::zeros(DType::F32, &[0, 4]).unwrap();
    assert!(empty.is_empty());
    assert_eq!(
        empty.sum_axis(0).unwrap().to_vec::<f32>().unwrap(),
        vec![0.0; 4]
    );
}

#[test]
fn mismatches_are_errors() {
    let a = Tensor::zeros(DType::F32, &[2, 3]).unwrap();
    let b = Tensor::zeros(DType::F32, &[4]).unwrap();
    let c = Tensor::zeros(DType::F64, &[2, 3]).unwrap();
    let i = Tensor::zeros(DType::I32, &[2, 3]).unwrap();
    let msg = |e: Error| e.to_string();
    assert!(matches!(a.add(&b), Err(Error::Shape { .. })));
    assert!(msg(a.add(&b).unwrap_err()).contains("[2, 3] and [4]"));
    assert!(matches!(a.add(&c), Err(Error::DType { .. })));
    assert!(msg(a.mul(&c).unwrap_err()).contains("f32"));
    assert!(matches!(a.matmul(&a), Err(Error::Shape { .. })));
    assert!(matches!(i.exp(), Err(Error::DType { .. })));
    assert!(matches!(i.softmax(0), Err(Error::DType { .. })));
    assert!(matches!(a.sum_axis(2), Err(Error::Shape { .. })));
    assert!(matches!(a.reshape(&[7]), Err(Error::Shape { .. })));
    assert!(matches!(a.broadcast_to(&[3, 3]), Err(Error::Shape { .. })));
    assert!(matches!(a.to_vec::<f64>(), Err(Error::DType { .. })));
    assert!(matches!(
        Tensor::from_slice(&[1.0f32; 5], &[2, 3]),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        Tensor::zeros(DType::F64, &[usize::MAX, 2]),
        Err(Error::Shape { .. })
    ));
    let ones = Tensor::ones(DType::I32, &[2, 3]).unwrap();
    assert!(ones.div(&i).is_err(), "integer division by zero");
}

#[test]
fn a_constructors_errors_name_the_constructor_called() {
    // Semantics "Errors": every message names what was wrong; zeros_in said `full`, and
    // from_vec `from_slice`.
    let source = ndmem::MemorySource::new(ndmem::alloc::Pool::new(
        ndmem::alloc::Limits::builder().build(),
    ));
    let op = |r: Result<Tensor, Error>| match r {
        Err(Error::Shape { op, .. }) => op,
        other => panic!("{other:?}"),
    };
    let huge = [usize::MAX, 2];
    assert_eq!(op(Tensor::zeros(DType::F32, &huge)), "zeros");
    assert_eq!(op(Tensor::zeros_in(&source, DType::F32, &huge)), "zeros_in");
    assert_eq!(
        op(Tensor::full_in(&source, DType::F32, &huge, 1.0)),
        "full_in"
    );
    assert_eq!(op(Tensor::from_vec(vec![1.0f32; 3], &[2, 2])), "from_vec");
    assert_eq!(op(Tensor::from_slice(&[1.0f32; 3], &[2, 2])), "from_slice");
    assert_eq!(
        op(Tensor::from_slice_in(&source, &[1.0f32; 3], &[2, 2])),
        "from_slice_in"
    );
    let message = Tensor::from_vec(vec![1.0f32; 3], &[2, 2])
        .unwrap_err()
        .to_string();
    assert!(message.contains("from_vec"), "{message}");
    assert_eq!(source.pool().stats().live_bytes, 0, "nothing was allocated");
}

#[test]
fn in_place_updates_need_the_only_handle() {
    let mut w = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let g = Tensor::from_slice(&[10.0f32, 20.0, 30.0], &[3]).unwrap();
    w.scaled_add(-0.1, &g).unwrap();
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![0.0, 0.0, 0.0]);
    w.assign(&Tensor::full(DType::F32, &[1], 4.0).unwrap())
        .unwrap();
    assert_eq!(
        w.to_vec::<f32>().unwrap(),
        vec![4.0; 3],
        "assign broadcasts"
    );
    let reader = w.clone();
    match w.assign(&g) {
        Err(Error::SharedTensor { op, others }) => assert_eq!((op.as_str(), others), ("assign", 1)),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        reader.to_vec::<f32>().unwrap(),
        vec![4.0; 3],
        "the shared memory is untouched"
    );
    drop(reader);
    assert!(
        w.assign(&g.reshape(&[3, 1]).unwrap()).is_err(),
        "must broadcast to w's shape"
    );
    let mut i = Tensor::zeros(DType::I32, &[3]).unwrap();
    assert!(matches!(i.assign(&g), Err(Error::DType { .. })));
    // A scope-owned tensor updates in place too (the scope's reference is not a handle).
    let scope = ndmem::Scope::new_base("params");
    let mut p = scope.ones(DType::F64, &[2, 2]).unwrap();
    p.scaled_add(2.0, &Tensor::ones(DType::F64, &[2]).unwrap())
        .unwrap();
    assert_eq!(p.to_vec::<f64>().unwrap(), vec![3.0; 4]);
}

#[test]
fn log_softmax_matches_ndarray_and_stays_finite_where_softmax_underflows() {
    let a = Array2::from_shape_fn((3, 4), |(i, j)| ((i * 4 + j) as f64).cos() * 3.0).into_dyn();
    let t = Tensor::from_slice(a.as_slice().unwrap(), &[3, 4]).unwrap();
    let e = a.mapv(f64::exp);
    let expected = (&e / &e.sum_axis(Axis(1)).insert_axis(Axis(1))).mapv(f64::ln);
    close(&arr(&t.log_softmax(1).unwrap()), &expected);
    // Along axis 0 of a transposed view: the transpose of the axis-1 result.
    let lt = arr::<f64>(&t.transpose().unwrap().log_softmax(0).unwrap());
    close(&lt, &expected.t().to_owned());

    // A confident lane: softmax underflows to 0 (its log is -inf), log_softmax does not.
    let confident = Tensor::from_slice(&[0.0f32, 200.0, -200.0], &[1, 3]).unwrap();
    let via_softmax = confident.softmax(1).unwrap().log().unwrap();
    assert!(via_softmax.to_vec::<f32>().unwrap()[2].is_infinite());
    let direct = confident.log_softmax(1).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(direct, vec![-200.0, 0.0, -400.0]);
    // Large logits: x - max - ln(sum), so ln(sum) is not rounded away beside the max.
    let large = Tensor::from_slice(&[1e8f32, 1e8], &[2]).unwrap();
    let half = -std::f32::consts::LN_2;
    assert_eq!(
        large.log_softmax(0).unwrap().to_vec::<f32>().unwrap(),
        [half; 2]
    );
    let huge = Tensor::from_slice(&[1e30f64, 1e30], &[1, 2]).unwrap();
    let strided = huge.transpose().unwrap().log_softmax(0).unwrap();
    assert_eq!(
        strided.to_vec::<f64>().unwrap(),
        [-std::f64::consts::LN_2; 2]
    );

    let i = Tensor::zeros(DType::I32, &[2, 3]).unwrap();
    assert!(matches!(i.log_softmax(0), Err(Error::DType { .. })));
    assert!(matches!(t.log_softmax(2), Err(Error::Shape { .. })));
}

#[test]
fn zero_size_shapes_with_huge_axes_are_shape_errors_not_panics() {
    let shape_err = |r: Result<Tensor, Error>| matches!(r, Err(Error::Shape { .. }));
    assert!(shape_err(Tensor::zeros(DType::F32, &[0, usize::MAX])));
    // The message is true of a shape with no elements: what overflows is the product of
    // the non-zero axis lengths (ndarray's rule), not the element count.
    let message = Tensor::zeros(DType::F32, &[0, usize::MAX])
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("non-zero axis lengths") && message.contains("isize"),
        "{message}"
    );
    assert!(!message.contains("more elements than"), "{message}");
    assert!(shape_err(Tensor::zeros(DType::F64, &[usize::MAX, 0])));
    assert!(shape_err(Tensor::ones(DType::U8, &[0, 1 << 40, 1 << 40])));
    assert!(shape_err(Tensor::from_slice::<f32>(&[], &[1 << 62, 0, 4])));
    let empty = Tensor::zeros(DType::F32, &[0]).unwrap();
    assert!(shape_err(empty.reshape(&[0, 1 << 40, 1 << 40])));
    assert!(shape_err(empty.reshape(&[1 << 40, 1 << 40, 0])));
    let one = Tensor::zeros(DType::F32, &[1]).unwrap();
    assert!(shape_err(one.broadcast_to(&[1 << 62, 1 << 62])));
    // Within isize: fine, and usable.
    let wide = Tensor::zeros(DType::F32, &[0, 1 << 40]).unwrap();
    assert_eq!(wide.len(), 0);
    assert_eq!(wide.sum_axis(1).unwrap().shape(), &[0]);
    let t = wide.transpose().unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), Vec::<f32>::new());
    assert_eq!(t.reshape(&[0]).unwrap().shape(), &[0]);
    // Ops over its 2^40 empty lanes answer at once: an empty result is not filled.
    for (name, out) in [
        ("softmax(0)", wide.softmax(0)),
        ("log_softmax(0)", wide.log_softmax(0)),
        ("transposed softmax(1)", t.softmax(1)),
        ("relu", wide.relu()),
    ] {
        assert_eq!(out.unwrap().len(), 0, "{name}");
    }
}

#[test]
fn an_in_place_update_of_an_empty_tensor_from_a_broadcast_source_writes_nothing() {
    // `assign` copies `src` broadcast to this shape; with no element, nothing (NumPy's
    // `a[...] = b`), whatever strides the empty shape has.
    for (target, source) in [
        (&[0usize, 3][..], &[3usize][..]),
        (&[0, 3], &[1, 3]),
        (&[0, 5, 4], &[4]),
    ] {
        let mut e = Tensor::zeros(DType::F32, target).unwrap();
        e.assign(&Tensor::ones(DType::F32, source).unwrap())
            .unwrap();
        e.scaled_add(2.0, &Tensor::ones(DType::F32, source).unwrap())
            .unwrap();
        assert_eq!(e.shape(), target);
        // A source that does not broadcast is still refused.
        assert!(matches!(
            e.assign(&Tensor::ones(DType::F32, &[2]).unwrap()),
            Err(Error::Shape { .. })
        ));
    }
}

#[test]
fn integer_arithmetic_wraps_and_undefined_division_is_an_error() {
    let big = Tensor::from_slice(&[i32::MAX, i32::MIN, 7], &[3]).unwrap();
    let one = Tensor::from_slice(&[1i32, 1, 1], &[3]).unwrap();
    assert_eq!(
        big.add(&one).unwrap().to_vec::<i32>().unwrap(),
        vec![i32::MIN, i32::MIN + 1, 8]
    );
    assert_eq!(
        big.sub(&one).unwrap().to_vec::<i32>().unwrap(),
        vec![i32::MAX - 1, i32::MAX, 6]
    );
    assert_eq!(
        big.mul(&big).unwrap().to_vec::<i32>().unwrap(),
        vec![1, 0, 49]
    );
    assert_eq!(
        big.add_scalar(1.0).unwrap().to_vec::<i32>().unwrap(),
        vec![i32::MIN, i32::MIN + 1, 8]
    );
    assert_eq!(
        big.mul_scalar(2.0).unwrap().to_vec::<i32>().unwrap(),
        vec![-2, 0, 14]
    );
    let wide = Tensor::from_slice(&[i64::MAX, 1], &[2]).unwrap();
    assert_eq!(wide.sum().unwrap().to_vec::<i64>().unwrap(), vec![i64::MIN]);
    assert_eq!(
        Tensor::from_slice(&[200u8, 100], &[2, 1])
            .unwrap()
            .sum_axis(0)
            .unwrap()
            .to_vec::<u8>()
            .unwrap(),
        vec![44]
    );
    let m = Tensor::from_slice(&[i32::MAX, 1, 1, 1], &[2, 2]).unwrap();
    assert_eq!(
        m.matmul(&m).unwrap().to_vec::<i32>().unwrap(),
        vec![
            i32::MAX.wrapping_mul(i32::MAX).wrapping_add(1),
            i32::MAX.wrapping_add(1),
            i32::MAX.wrapping_add(1),
            2
        ]
    );
    let mut acc = Tensor::from_slice(&[i32::MAX], &[1]).unwrap();
    acc.scaled_add(2.0, &Tensor::from_slice(&[i32::MAX], &[1]).unwrap())
        .unwrap();
    assert_eq!(acc.to_vec::<i32>().unwrap(), vec![i32::MAX.wrapping_mul(3)]);

    // Division: truncating, by zero and MIN / -1 are arithmetic errors (never panics).
    let num = Tensor::from_slice(&[7i32, -7, i32::MIN], &[3]).unwrap();
    let ok = Tensor::from_slice(&[2i32, 2, 2], &[3]).unwrap();
    assert_eq!(
        num.div(&ok).unwrap().to_vec::<i32>().unwrap(),
        vec![3, -3, i32::MIN / 2]
    );
    let minus_one = Tensor::from_slice(&[-1i32], &[1]).unwrap();
    match num.div(&minus_one) {
        Err(Error::Arithmetic { op, message }) => {
            assert_eq!(op, "div");
            assert!(message.contains("overflow"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let zero = Tensor::from_slice(&[1i64, 0], &[2]).unwrap();
    match Tensor::ones(DType::I64, &[2]).unwrap().div(&zero) {
        Err(Error::Arithmetic { op, message }) => {
            assert_eq!(op, "div");
            assert!(message.contains("division by zero"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        Tensor::ones(DType::U8, &[1])
            .unwrap()
            .div(&Tensor::zeros(DType::U8, &[1]).unwrap()),
        Err(Error::Arithmetic { .. })
    ));
    // Floats follow IEEE 754.
    let f = Tensor::from_slice(&[1.0f32, 0.0], &[2]).unwrap();
    let z = Tensor::zeros(DType::F32, &[2]).unwrap();
    let q = f.div(&z).unwrap().to_vec::<f32>().unwrap();
    assert!(q[0].is_infinite() && q[1].is_nan());
}

#[test]
fn argmax_answers_the_first_nan_as_numpy_does() {
    let lanes = |data: &[f32]| {
        Tensor::from_slice(data, &[1, data.len()])
            .unwrap()
            .argmax(1)
            .unwrap()
            .to_vec::<i64>()
            .unwrap()[0]
    };
    let nan = f32::NAN;
    assert_eq!(lanes(&[1.0, nan, 3.0]), 1);
    assert_eq!(lanes(&[nan, 1.0]), 0);
    assert_eq!(lanes(&[2.0, nan, nan, 5.0]), 1);
    assert_eq!(
        lanes(&[1.0, 3.0, 3.0, f32::NEG_INFINITY]),
        1,
        "the first on ties"
    );
    assert_eq!(lanes(&[f32::NEG_INFINITY, f32::INFINITY]), 1);
    // Integers have no NaN: the largest, the first on ties.
    let ints = Tensor::from_slice(&[3i32, 9, 9, -1], &[4]).unwrap();
    assert_eq!(ints.argmax(0).unwrap().to_vec::<i64>().unwrap(), vec![1]);
}

#[test]
fn mean_of_no_elements_is_an_error_and_argmax_of_an_empty_axis_too() {
    let empty = Tensor::zeros(DType::F64, &[0, 3]).unwrap();
    assert!(matches!(empty.mean(), Err(Error::Shape { .. })));
    assert!(matches!(empty.mean_axis(0), Err(Error::Shape { .. })));
    assert_eq!(empty.mean_axis(1).unwrap().shape(), &[0]);
    assert_eq!(empty.sum().unwrap().scalar().unwrap(), 0.0);
    assert!(matches!(empty.argmax(0), Err(Error::Shape { .. })));
    let a = ndarray::ArrayD::<f64>::zeros(IxDyn(&[0, 3]));
    assert!(a.mean().is_none() && a.mean_axis(Axis(0)).is_none());
    let ints = Tensor::from_slice(&[1i32, 2, 4, i32::MAX, i32::MAX, 1], &[2, 3]).unwrap();
    assert_eq!(
        ints.mean_axis(1).unwrap().to_vec::<i32>().unwrap(),
        vec![2, 1431655765]
    );
}

/// `t`'s elements equal `expected`'s within a relative `tol`.
fn near<T: ndmem::Element>(what: &str, t: &Tensor, expected: ArrayD<T>, tol: f64) {
    assert_eq!(t.shape(), expected.shape(), "{what}: shape");
    let got = t.to_vec::<T>().unwrap();
    for (i, (g, e)) in got.iter().zip(expected.iter()).enumerate() {
        let (g, e) = (g.to_f64(), e.to_f64());
        assert!(
            (g - e).abs() <= tol * (1.0 + e.abs()),
            "{what}[{i}]: {g} != {e}"
        );
    }
}

macro_rules! every_op_matches_ndarray {
    ($name:ident, $t:ty, $tol:expr) => {
        #[test]
        fn $name() {
            type T = $t;
            let tol: f64 = $tol;
            let a =
                Array2::<T>::from_shape_fn((3, 4), |(i, j)| ((i * 4 + j) as T * 0.37).sin() + 0.1);
            let b = Array2::<T>::from_shape_fn((4, 3), |(i, j)| {
                ((i * 3 + j) as T * 0.53).cos() * 2.0 + 3.0
            });
            let ta = Tensor::from_slice(a.as_slice().unwrap(), &[3, 4]).unwrap();
            let tb = Tensor::from_slice(b.as_slice().unwrap(), &[4, 3]).unwrap();
            // Non-contiguous operands: transposed views.
            let (tbt, bt) = (tb.transpose().unwrap(), b.t().to_owned());
            let (tat, at) = (ta.transpose().unwrap(), a.t().to_owned());
            let (a, b) = (a.into_dyn(), b.into_dyn());
            let (bt, at) = (bt.into_dyn(), at.into_dyn());
            near("add", &ta.add(&tbt).unwrap(), &a + &bt, tol);
            near("add^T", &tbt.add(&ta).unwrap(), &bt + &a, tol);
            near("sub", &ta.sub(&tbt).unwrap(), &a - &bt, tol);
            near("mul", &tbt.mul(&ta).unwrap(), &bt * &a, tol);
            near("div", &ta.div(&tbt).unwrap(), &a / &bt, tol);
            near("div^T", &tbt.div(&ta).unwrap(), &bt / &a, tol);
            // Broadcasting a row and a column of transposed views.
            near(
                "row+",
                &tbt.add(&tat.sum_axis(1).unwrap()).unwrap(),
                &bt + &at.sum_axis(Axis(1)),
                tol,
            );
            let col = tbt.sum_axis(1).unwrap().reshape(&[3, 1]).unwrap();
            near(
                "col*",
                &ta.mul(&col).unwrap(),
                &a * &bt.sum_axis(Axis(1)).insert_axis(Axis(1)),
                tol,
            );
            near(
                "add_scalar",
                &tbt.add_scalar(1.5).unwrap(),
                bt.mapv(|v| v + 1.5),
                tol,
            );
            near(
                "mul_scalar",
                &tbt.mul_scalar(-2.0).unwrap(),
                bt.mapv(|v| v * -2.0),
                tol,
            );
            near(
                "relu",
                &tbt.add_scalar(-3.0).unwrap().relu().unwrap(),
                bt.mapv(|v| (v - 3.0).max(0.0)),
                tol,
            );
            let shifted = ta.add_scalar(-0.5).unwrap();
            near(
                "relu_backward",
                &shifted.relu_backward(&tbt).unwrap(),
                ndarray::Zip::from(&a)
                    .and(&bt)
                    .map_collect(|&x, &g| if x - 0.5 > 0.0 { g } else { 0.0 }),
                tol,
            );
            near(
                "sigmoid",
                &tbt.sigmoid().unwrap(),
                bt.mapv(|v| 1.0 / (1.0 + (-v).exp())),
                tol,
            );
            near("tanh", &tbt.tanh().unwrap(), bt.mapv(T::tanh), tol);
            near("exp", &tbt.exp().unwrap(), bt.mapv(T::exp), tol);
            near("log", &tbt.log().unwrap(), bt.mapv(T::ln), tol);
            near(
                "matmul",
                &ta.matmul(&tb).unwrap(),
                a.clone()
                    .into_dimensionality::<ndarray::Ix2>()
                    .unwrap()
                    .dot(&b.clone().into_dimensionality::<ndarray::Ix2>().unwrap())
                    .into_dyn(),
                tol,
            );
            let (a2, b2) = (
                a.clone().into_dimensionality::<ndarray::Ix2>().unwrap(),
                b.clone().into_dimensionality::<ndarray::Ix2>().unwrap(),
            );
            near(
                "matmul^T",
                &tbt.matmul(&tat).unwrap(),
                b2.t().dot(&a2.t()).into_dyn(),
                tol,
            );
            near(
                "sum",
                &tbt.sum().unwrap(),
                ndarray::arr0(bt.sum()).into_dyn(),
                tol,
            );
            for axis in 0..2 {
                near(
                    "sum_axis",
                    &tbt.sum_axis(axis).unwrap(),
                    bt.sum_axis(Axis(axis)),
                    tol,
                );
                near(
                    "mean_axis",
                    &tbt.mean_axis(axis).unwrap(),
                    bt.mean_axis(Axis(axis)).unwrap(),
                    tol,
                );
                let e = bt.mapv(T::exp);
                let softmax = &e / &e.sum_axis(Axis(axis)).insert_axis(Axis(axis));
                near("softmax", &tbt.softmax(axis).unwrap(), softmax.clone(), tol);
                near(
                    "log_softmax",
                    &tbt.log_softmax(axis).unwrap(),
                    softmax.mapv(T::ln),
                    tol,
                );
                let argmax: Vec<i64> = bt
                    .lanes(Axis(axis))
                    .into_iter()
                    .map(|l| {
                        let mut best = 0;
                        for (i, v) in l.iter().enumerate() {
                            if *v > l[best] {
                                best = i;
                            }
                        }
                        best as i64
                    })
                    .collect();
                assert_eq!(tbt.argmax(axis).unwrap().to_vec::<i64>().unwrap(), argmax);
            }
            near(
                "mean",
                &tbt.mean().unwrap(),
                ndarray::arr0(bt.mean().unwrap()).into_dyn(),
                tol,
            );
            near("transpose", &tbt, bt.clone(), 0.0);
            near(
                "reshape",
                &tbt.reshape(&[2, 6]).unwrap(),
                bt.iter()
                    .copied()
                    .collect::<ndarray::Array1<T>>()
                    .into_shape_with_order((2, 6))
                    .unwrap()
                    .into_dyn(),
                0.0,
            );
            near(
                "broadcast_to",
                &tbt.broadcast_to(&[2, 3, 4]).unwrap(),
                bt.broadcast(IxDyn(&[2, 3, 4])).unwrap().to_owned(),
                0.0,
            );
            // In place: assign and scaled_add from transposed sources.
            let mut w = tb.transpose().unwrap().copy().unwrap();
            w.scaled_add(0.25, &ta).unwrap();
            near("scaled_add", &w, &bt + &a.mapv(|v| v * 0.25), tol);
            w.assign(&tat.transpose().unwrap()).unwrap();
            near("assign", &w, a.clone(), 0.0);
        }
    };
}

every_op_matches_ndarray!(every_op_matches_ndarray_f32, f32, 1e-5);
every_op_matches_ndarray!(every_op_matches_ndarray_f64, f64, 1e-12);

/// The same values laid out as a strided view: `t`'s transpose copied out, then
/// transposed back (equal elements, strides that are not row-major), so ops on it take
/// ndarray's path where `t` takes the contiguous one.
fn strided(t: &Tensor) -> Tensor {
    let view = t
        .transpose()
        .unwrap()
        .detach()
        .unwrap()
        .transpose()
        .unwrap();
    assert_eq!(view.to_vec::<f32>().unwrap(), t.to_vec::<f32>().unwrap());
    view
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>()
        .unwrap()
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

/// Contiguous operands take a path over plain slices and strided ones ndarray's: both
/// give the same bits, for shapes whose lanes are shorter and longer than ndarray's unroll
/// of 8, with a bias row and a scalar broadcast. A sum's bits depend on the order it adds
/// in, which ndarray picks from the layout (its unrolled order for adjacent elements, in
/// order from zero for strided ones): the contiguous path's sums equal ndarray's on the
/// same row-major layout, lane by lane.
#[test]
fn contiguous_and_strided_operands_give_the_same_bits() {
    for (rows, cols) in [(16, 32), (16, 3), (5, 37), (1, 9), (9, 1)] {
        let x = Tensor::rand(DType::F32, &[rows, cols], 7).unwrap();
        let y = Tensor::rand(DType::F32, &[rows, cols], 8).unwrap();
        let row = Tensor::rand(DType::F32, &[cols], 9).unwrap();
        let one = Tensor::rand(DType::F32, &[1, 1], 10).unwrap();
        let (xs, ys) = (strided(&x), strided(&y));
        let what = format!("{rows}x{cols}");
        let same = |op: &str, fast: Tensor, slow: Tensor| {
            assert_eq!(fast.shape(), slow.shape(), "{what} {op}");
            assert_eq!(bits(&fast), bits(&slow), "{what} {op}");
        };
        let a = arr::<f32>(&x);
        let lanes = |axis: usize| -> Vec<u32> {
            a.lanes(Axis(axis))
                .into_iter()
                .map(|lane| lane.sum().to_bits())
                .collect()
        };
        assert_eq!(bits(&x.sum().unwrap()), [a.sum().to_bits()], "{what}");
        assert_eq!(bits(&x.sum_axis(0).unwrap()), lanes(0), "{what} sum 0");
        assert_eq!(bits(&x.sum_axis(1).unwrap()), lanes(1), "{what} sum 1");
        same("add", x.add(&y).unwrap(), xs.add(&ys).unwrap());
        same("sub row", x.sub(&row).unwrap(), xs.sub(&row).unwrap());
        same("row div", row.div(&x).unwrap(), row.div(&xs).unwrap());
        same("mul one", x.mul(&one).unwrap(), xs.mul(&one).unwrap());
        same("exp", x.exp().unwrap(), xs.exp().unwrap());
        same("softmax", x.softmax(1).unwrap(), xs.softmax(1).unwrap());
        same(
            "log_softmax",
            x.log_softmax(1).unwrap(),
            xs.log_softmax(1).unwrap(),
        );
        same("detach", x.detach().unwrap(), xs.detach().unwrap());
        let mut fast = x.detach().unwrap();
        fast.scaled_add(-0.1, &y).unwrap();
        let mut slow = x.detach().unwrap();
        slow.scaled_add(-0.1, &ys).unwrap();
        same("scaled_add", fast, slow);
    }
}

/// The small matmul kernel has a copy for each pair of operand layouts (rows contiguous,
/// columns contiguous, neither): every pair, at a shape that uses each tile width (8, 4,
/// 2, 1 columns) and both row blocks (4 and 1 rows), and at products 1, 2 and 3 columns
/// wide (tiled by 8, 4, 2 and 1 rows instead), gives the product of the same values bit
/// for bit as summed over `k` in order from zero.
#[test]
fn matmul_gives_the_same_bits_for_every_operand_layout() {
    for (m, k, n) in [(6, 5, 15), (15, 5, 1), (15, 7, 2), (15, 6, 3), (2, 3, 3)] {
        matmul_bits_for_every_layout(m, k, n);
    }
}

fn matmul_bits_for_every_layout(m: usize, k: usize, n: usize) {
    let a = Array2::from_shape_fn((m, k), |(i, p)| ((i * k + p) as f32 * 0.37).sin());
    let b = Array2::from_shape_fn((k, n), |(p, j)| ((p * n + j) as f32 * 0.91).cos());
    let product = |a: &Array2<f32>, b: &Array2<f32>| {
        Array2::from_shape_fn((m, n), |(i, j)| {
            (0..k).fold(0.0f32, |sum, p| sum + a[[i, p]] * b[[p, j]])
        })
        .into_dyn()
    };
    // A matrix as a contiguous tensor, and as the transpose of a contiguous copy of its
    // transpose (columns contiguous); a constant matrix also as a broadcast scalar (both
    // strides 0, neither rows nor columns contiguous).
    let layouts = |x: &Array2<f32>| -> Vec<(String, Tensor, Array2<f32>)> {
        let (r, c) = x.dim();
        let xt = x.t().as_standard_layout().into_owned();
        let scalar = Tensor::from_slice(&[0.75f32], &[1, 1]).unwrap();
        vec![
            (
                "rows".into(),
                Tensor::from_slice(x.as_slice().unwrap(), &[r, c]).unwrap(),
                x.clone(),
            ),
            (
                "columns".into(),
                Tensor::from_slice(xt.as_slice().unwrap(), &[c, r])
                    .unwrap()
                    .transpose()
                    .unwrap(),
                x.clone(),
            ),
            (
                "strided".into(),
                scalar.broadcast_to(&[r, c]).unwrap(),
                Array2::from_elem((r, c), 0.75),
            ),
        ]
    };
    for (a_name, ta, a_values) in layouts(&a) {
        for (b_name, tb, b_values) in layouts(&b) {
            let got = arr::<f32>(&ta.matmul(&tb).unwrap());
            let expected = product(&a_values, &b_values);
            let bits = |x: &ArrayD<f32>| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got),
                bits(&expected),
                "[{m}, {k}] x [{k}, {n}]: A {a_name}, B {b_name}"
            );
        }
    }
}
