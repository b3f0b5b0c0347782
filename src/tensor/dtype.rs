//! Element types: the runtime tag [`DType`] and the compile-time [`Element`] trait that
//! maps Rust types onto it.

use std::fmt;

/// The element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// Unsigned byte.
    U8,
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::U8 => 1,
        }
    }

    /// Whether the type is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
        })
    }
}

/// Sealing: only the element types this module lists implement [`Element`] and [`Float`],
/// so every element is plain data whose bytemuck casts and arithmetic ndmem relies on.
/// The integer arithmetic the ops use lives here too, out of users' reach.
pub(crate) mod sealed {
    /// The supertrait nobody outside this crate can name, so nobody can implement.
    pub trait Sealed: Copy {
        /// `self + other`, wrapping on integer overflow.
        fn add_wrapping(self, other: Self) -> Self;
        /// `self - other`, wrapping on integer overflow.
        fn sub_wrapping(self, other: Self) -> Self;
        /// `self * other`, wrapping on integer overflow.
        fn mul_wrapping(self, other: Self) -> Self;
        /// `self / other`; `None` for integer division by zero or `MIN / -1`.
        fn div_checked(self, other: Self) -> Option<Self>;
        /// The sum of `values`: ndarray's `sum` for floats, a wrapping sum for integers.
        fn sum_of(values: ndarray::ArrayViewD<'_, Self>) -> Self;
        /// [`Sealed::sum_of`] of contiguous `values`, bit for bit (for floats, ndarray's
        /// eightfold unrolled sum, which is what its `sum` runs on a contiguous array).
        fn sum_slice(values: &[Self]) -> Self;
        /// The mean of `values` (`None` if empty): ndarray's `mean` for floats; for
        /// integers the `f64` mean converted back like `as`.
        fn mean_of(values: ndarray::ArrayViewD<'_, Self>) -> Option<Self>;
    }
}

macro_rules! sealed_float {
    ($t:ty) => {
        impl sealed::Sealed for $t {
            #[inline]
            fn add_wrapping(self, other: Self) -> Self {
                self + other
            }
            #[inline]
            fn sub_wrapping(self, other: Self) -> Self {
                self - other
            }
            #[inline]
            fn mul_wrapping(self, other: Self) -> Self {
                self * other
            }
            #[inline]
            fn div_checked(self, other: Self) -> Option<Self> {
                Some(self / other)
            }
            #[inline]
            fn sum_of(values: ndarray::ArrayViewD<'_, Self>) -> Self {
                values.sum()
            }
            #[inline]
            fn sum_slice(values: &[Self]) -> Self {
                ndarray::ArrayView1::from(values).sum()
            }
            #[inline]
            fn mean_of(values: ndarray::ArrayViewD<'_, Self>) -> Option<Self> {
                values.mean()
            }
        }
    };
}

macro_rules! sealed_int {
    ($t:ty) => {
        impl sealed::Sealed for $t {
            #[inline]
            fn add_wrapping(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
            #[inline]
            fn sub_wrapping(self, other: Self) -> Self {
                self.wrapping_sub(other)
            }
            #[inline]
            fn mul_wrapping(self, other: Self) -> Self {
                self.wrapping_mul(other)
            }
            #[inline]
            fn div_checked(self, other: Self) -> Option<Self> {
                self.checked_div(other)
            }
            #[inline]
            fn sum_of(values: ndarray::ArrayViewD<'_, Self>) -> Self {
                values.fold(0, |acc, v| acc.wrapping_add(*v))
            }
            #[inline]
            fn sum_slice(values: &[Self]) -> Self {
                values.iter().fold(0, |acc, v| acc.wrapping_add(*v))
            }
            #[inline]
            fn mean_of(values: ndarray::ArrayViewD<'_, Self>) -> Option<Self> {
                (!values.is_empty()).then(|| {
                    (values.fold(0.0, |acc, v| acc + *v as f64) / values.len() as f64) as $t
                })
            }
        }
    };
}
sealed_float!(f32);
sealed_float!(f64);
sealed_int!(i32);
sealed_int!(i64);
sealed_int!(u8);

/// A Rust type that can be a tensor element: `f32`, `f64`, `i32`, `i64`, `u8`. The trait is
/// sealed (it cannot be implemented outside ndmem).
///
/// Integer arithmetic in ops wraps on overflow (two's complement, like NumPy and PyTorch
/// integer tensors, in debug and release builds alike); integer division by zero and
/// `MIN / -1` are [`crate::Error::Arithmetic`].
pub trait Element:
    sealed::Sealed + bytemuck::Pod + ndarray::LinalgScalar + PartialOrd + Send + Sync + fmt::Debug
{
    /// The tag of this type.
    const DTYPE: DType;
    /// The value from an `f64` (rounded, truncated or saturated like `as`).
    fn from_f64(value: f64) -> Self;
    /// The value as an `f64`.
    fn to_f64(self) -> f64;
}

macro_rules! element {
    ($t:ty, $tag:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$tag;
            #[inline]
            fn from_f64(value: f64) -> Self {
                value as $t
            }
            #[inline]
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    };
}
element!(f32, F32);
element!(f64, F64);
element!(i32, I32);
element!(i64, I64);
element!(u8, U8);

/// A floating-point element: the types transcendental ops (exp, log, tanh, ...) accept
/// (`f32`, `f64`). Sealed like [`Element`], its supertrait.
pub trait Float: Element + ndarray::NdFloat {}
impl Float for f32 {}
impl Float for f64 {}
