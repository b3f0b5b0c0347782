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

/// A Rust type that can be a tensor element.
pub trait Element:
    bytemuck::Pod + ndarray::LinalgScalar + PartialOrd + Send + Sync + fmt::Debug
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

/// A floating-point element: the types transcendental ops (exp, log, tanh, ...) accept.
pub trait Float: Element + ndarray::NdFloat {}
impl Float for f32 {}
impl Float for f64 {}
