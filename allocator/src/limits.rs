//! The three budgets (heap, off-heap, physical) and the per-device budget: how sizes are
//! written, where the values come from and what they default to (semantics §1).
//!
//! Sizes are binary multiples (`64K` = 65536), case-insensitive, with an optional `B` or
//! `iB`, or a percentage of physical RAM (`50%`; in `NDMEM_MAX_DEVICE_BYTES`, of each
//! device's memory, resolved per device by the device layer). Garbage is an error naming
//! the variable and the value, never a silent default. `0` in an environment variable
//! means "no limit", as JavaCPP's `maxbytes=0` does.

use crate::counter::UNLIMITED;
use crate::error::ConfigError;
use crate::physical::physical_ram;

/// Environment variable of the heap budget (bytes live through [`crate::Tracking`]).
pub const ENV_MAX_HEAP: &str = "NDMEM_MAX_HEAP";
/// Environment variable of the off-heap budget (bytes held by the native pool).
pub const ENV_MAX_BYTES: &str = "NDMEM_MAX_BYTES";
/// Environment variable of the physical budget (resident set size of the process).
pub const ENV_MAX_PHYSICAL_BYTES: &str = "NDMEM_MAX_PHYSICAL_BYTES";
/// Environment variable of the per-device budget (bytes held on each GPU).
pub const ENV_MAX_DEVICE_BYTES: &str = "NDMEM_MAX_DEVICE_BYTES";

/// Why a text is not a size; the allocation-free core of [`ConfigError::InvalidSize`].
pub(crate) type SizeError = &'static str;

/// Parses a size: `123`, `64K`, `512M`, `8G`, `1T`, `1.5G`, `64KiB`, `100B` or `NN%` of RAM.
///
/// ```
/// assert_eq!(ndmem_alloc::parse_size("64K").unwrap(), 65536);
/// assert_eq!(ndmem_alloc::parse_size("1.5GiB").unwrap(), 3 << 29);
/// assert!(ndmem_alloc::parse_size("8X").is_err());
/// ```
pub fn parse_size(text: &str) -> Result<usize, ConfigError> {
    parse_size_bytes(text.as_bytes()).map_err(|reason| ConfigError::InvalidSize {
        variable: "size".into(),
        value: text.into(),
        reason,
    })
}

/// [`parse_size`] for a named variable, so the error says which one was wrong. A
/// percentage in [`ENV_MAX_DEVICE_BYTES`] is of each device's memory, and its errors say
/// so; in the other variables it is of RAM.
pub(crate) fn parse_size_named(variable: &str, text: &str) -> Result<usize, ConfigError> {
    let whole_of = if variable == ENV_MAX_DEVICE_BYTES {
        PercentOf::Device
    } else {
        PercentOf::Ram
    };
    parse_size_of(text.as_bytes(), whole_of).map_err(|reason| ConfigError::InvalidSize {
        variable: variable.into(),
        value: text.into(),
        reason,
    })
}

/// `NDMEM_MAX_DEVICE_BYTES` as the host reads it: a size (`Some`; `None` for `0`, no
/// limit), or `None` for a percentage, a share of each device's memory that only the device
/// layer can resolve (`ndmem::device::DeviceLimit`, when a device is opened). Of a
/// percentage the host checks only that it is one, at most 100% and with no more digits
/// than the device layer takes; whether it comes to at least one byte is the device's to
/// judge, never host RAM's.
pub(crate) fn parse_device_size(text: &str) -> Result<Option<usize>, ConfigError> {
    let invalid = |reason| ConfigError::InvalidSize {
        variable: ENV_MAX_DEVICE_BYTES.into(),
        value: text.into(),
        reason,
    };
    let (whole, fraction, suffix) = split_size(text.as_bytes()).map_err(invalid)?;
    if suffix != b"%" {
        return parse_size_named(ENV_MAX_DEVICE_BYTES, text).map(limit_of);
    }
    // Leading zeros of the whole part and trailing ones of the fraction say nothing.
    let significant = |digits: &[u8], zeros_at_start: bool| {
        let zero = |d: &&u8| **d == b'0';
        if zeros_at_start {
            digits.iter().skip_while(zero).count()
        } else {
            digits.iter().rev().skip_while(zero).count()
        }
    };
    if significant(whole, true) > 4 || fraction.map_or(0, |f| significant(f, false)) > 12 {
        return Err(invalid("it has too many digits"));
    }
    // The device drops the fraction's trailing zeros before it scales: so does this check.
    let fraction = fraction.map(|f| &f[..significant(f, false)]);
    percentage(whole, fraction, PercentOf::Device).map_err(invalid)?;
    Ok(None)
}

/// What a percentage is a share of, for the wording of its errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PercentOf {
    /// Physical RAM (`NDMEM_MAX_HEAP`, `NDMEM_MAX_BYTES`, `NDMEM_MAX_PHYSICAL_BYTES`).
    Ram,
    /// Each device's memory (`NDMEM_MAX_DEVICE_BYTES`, resolved per device when it is
    /// opened).
    Device,
}

impl PercentOf {
    fn over_100(self) -> SizeError {
        match self {
            PercentOf::Ram => "a percentage of RAM cannot exceed 100%",
            PercentOf::Device => "a percentage of each device's memory cannot exceed 100%",
        }
    }
}

/// The parser itself, percentages of RAM. It allocates nothing, so the global allocator
/// can use it.
pub(crate) fn parse_size_bytes(text: &[u8]) -> Result<usize, SizeError> {
    parse_size_of(text, PercentOf::Ram)
}

/// The parts of a size: the whole number, its fraction and the unit after them.
type SizeParts<'a> = (&'a [u8], Option<&'a [u8]>, &'a [u8]);

/// Splits `1.5 GiB` into `1`, `Some(5)` and `GiB`, refusing what is no number at all.
fn split_size(text: &[u8]) -> Result<SizeParts<'_>, SizeError> {
    let text = text.trim_ascii();
    if text.is_empty() {
        return Err("it is empty");
    }
    if text[0] == b'-' {
        return Err("sizes cannot be negative");
    }
    let number_len = text
        .iter()
        .position(|b| !(b.is_ascii_digit() || *b == b'.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(number_len);
    let (whole, fraction) = split_decimal(number)?;
    Ok((whole, fraction, suffix.trim_ascii_start()))
}

/// A percentage `whole.fraction` as `scaled / denominator` percent, at most 100%.
fn percentage(
    whole: &[u8],
    fraction: Option<&[u8]>,
    whole_of: PercentOf,
) -> Result<(u128, u128), SizeError> {
    let (scaled, denominator) = scale_decimal(whole, fraction)?;
    if scaled > 100 * denominator {
        return Err(whole_of.over_100());
    }
    Ok((scaled, denominator))
}

/// [`parse_size_bytes`], a percentage's errors worded for `whole_of`.
fn parse_size_of(text: &[u8], whole_of: PercentOf) -> Result<usize, SizeError> {
    let (whole, fraction, suffix) = split_size(text)?;

    if suffix == b"%" {
        // Percent of RAM: whole.fraction / 100 * ram, computed in integers.
        let (scaled, denominator) = percentage(whole, fraction, whole_of)?;
        let ram = physical_ram() as u128;
        let bytes = scale_by(scaled, ram, 100 * denominator).ok_or("it overflows")?;
        if bytes == 0 && scaled > 0 {
            // Not "0" (no limit): the user asked for a limit, just a tiny one.
            return Err("the percentage is less than one byte of RAM (0 means no limit)");
        }
        return usize::try_from(bytes).map_err(|_| "it overflows");
    }

    let shift = unit_shift(suffix)?;
    let (scaled, denominator) = scale_decimal(whole, fraction)?;
    let bytes = scale_by(scaled, 1u128 << shift, denominator).ok_or("it overflows")?;
    if fraction.is_some() && shift == 0 && scaled % denominator != 0 {
        return Err("a byte count must be a whole number");
    }
    if bytes == 0 && scaled > 0 {
        return Err("it is less than one byte (0 means no limit)");
    }
    usize::try_from(bytes)
        .ok()
        .filter(|b| *b <= isize::MAX as usize)
        .ok_or("it overflows")
}

/// Splits `12.5` into `12` and `Some(5)`; rejects `1.5.2`, `.`, and an empty number.
fn split_decimal(number: &[u8]) -> Result<(&[u8], Option<&[u8]>), SizeError> {
    let mut parts = number.splitn(2, |b| *b == b'.');
    let whole = parts.next().unwrap_or_default();
    let fraction = parts.next();
    if fraction.is_some_and(|f| f.contains(&b'.')) {
        return Err("it has more than one decimal point");
    }
    if whole.is_empty() && fraction.map_or(true, |f| f.is_empty()) {
        return Err("it does not start with a number");
    }
    if fraction.is_some_and(|f| f.is_empty()) {
        return Err("a decimal point must be followed by digits");
    }
    Ok((whole, fraction))
}

/// `whole.fraction` as `scaled / denominator` in exact integers. The whole part is at most
/// `u64::MAX` (more overflows any size) and the fraction 18 digits, so `scaled` stays
/// below 2^124 and `denominator` at most 10^18.
fn scale_decimal(whole: &[u8], fraction: Option<&[u8]>) -> Result<(u128, u128), SizeError> {
    let fraction = fraction.unwrap_or_default();
    if fraction.len() > 18 {
        return Err("it has too many decimal places");
    }
    let mut scaled: u128 = 0;
    for digit in whole {
        scaled = scaled
            .checked_mul(10)
            .and_then(|s| s.checked_add(u128::from(digit - b'0')))
            .filter(|s| *s <= u128::from(u64::MAX))
            .ok_or("it overflows")?;
    }
    for digit in fraction {
        // Cannot overflow: below 2^64 x 10^18 < 2^124.
        scaled = scaled * 10 + u128::from(digit - b'0');
    }
    Ok((scaled, 10u128.pow(fraction.len() as u32)))
}

/// `floor(scaled * factor / denominator)` for `scaled < 2^124` and `denominator <= 10^20`;
/// `None` if it overflows `u128` (it cannot be a size then). `rest * factor` fits for a
/// `factor` up to 2^61 (a unit, at most 2^50, or the bytes of RAM); beyond, it is checked.
fn scale_by(scaled: u128, factor: u128, denominator: u128) -> Option<u128> {
    let (whole, rest) = (scaled / denominator, scaled % denominator);
    whole
        .checked_mul(factor)?
        .checked_add(rest.checked_mul(factor)? / denominator)
}

/// `K`/`KB`/`KiB` and friends as a power of two; an empty suffix or `B` means bytes.
fn unit_shift(suffix: &[u8]) -> Result<u32, SizeError> {
    let (letter, rest) = match suffix.split_first() {
        None => return Ok(0),
        Some((b, rest)) => (b.to_ascii_lowercase(), rest),
    };
    let shift = match letter {
        b'b' if rest.is_empty() => return Ok(0),
        b'k' => 10,
        b'm' => 20,
        b'g' => 30,
        b't' => 40,
        b'p' => 50,
        _ => return Err("unknown unit (use K, M, G, T, P, optionally followed by B or iB)"),
    };
    match rest {
        b"" | b"b" | b"B" | b"ib" | b"iB" | b"IB" | b"Ib" => Ok(shift),
        _ => Err("unknown unit (use K, M, G, T, P, optionally followed by B or iB)"),
    }
}

/// Where a limit's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum LimitSource {
    /// Read from its environment variable.
    Environment,
    /// Set through [`LimitsBuilder`] or at run time.
    Explicit,
    /// The documented default (semantics §1).
    Default,
}

/// Where each of the four limits came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LimitSources {
    /// Source of [`Limits::max_heap`].
    pub max_heap: LimitSource,
    /// Source of [`Limits::max_bytes`].
    pub max_bytes: LimitSource,
    /// Source of [`Limits::max_physical_bytes`].
    pub max_physical_bytes: LimitSource,
    /// Source of [`Limits::max_device_bytes`].
    pub max_device_bytes: LimitSource,
}

/// The memory budgets of a process or of one [`crate::Pool`] (semantics §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes live through the tracking global allocator; `None`: tracked only.
    pub max_heap: Option<usize>,
    /// Bytes the native pool may hold (live blocks plus its cache); `None`: unlimited.
    pub max_bytes: Option<usize>,
    /// Resident set size the pool may grow the process to; `None`: unlimited.
    pub max_physical_bytes: Option<usize>,
    /// Bytes each GPU may hold. `None` when there is no figure in bytes: unset (the
    /// default, min(max_bytes, 90% of the device)), `0` or 4 EiB and more (no limit of
    /// ndmem's own), or a
    /// percentage of each device's memory (with [`LimitSource::Environment`]); all three are
    /// resolved per device when it is opened.
    pub max_device_bytes: Option<usize>,
    /// Where each value came from.
    pub sources: LimitSources,
}

impl Limits {
    /// Reads `NDMEM_MAX_HEAP`, `NDMEM_MAX_BYTES`, `NDMEM_MAX_PHYSICAL_BYTES` and
    /// `NDMEM_MAX_DEVICE_BYTES`, filling the rest with the defaults of semantics §1.
    ///
    /// Garbage in any of the four is [`ConfigError::InvalidSize`] naming it: this is the
    /// check of the whole environment (the `ndmem` command's). Each user of a variable reads
    /// only its own: the global pool ([`crate::Pool::try_global`]) `NDMEM_MAX_BYTES` and
    /// `NDMEM_MAX_PHYSICAL_BYTES`, the heap ([`crate::heap::env_error`]) `NDMEM_MAX_HEAP`,
    /// a device `NDMEM_MAX_DEVICE_BYTES` when it is opened. A percentage in
    /// `NDMEM_MAX_DEVICE_BYTES` is checked only for its form here (see
    /// [`Limits::max_device_bytes`]).
    pub fn from_env() -> Result<Limits, ConfigError> {
        Self::from_lookup(env_value)
    }

    /// The global pool's limits: `NDMEM_MAX_BYTES` and `NDMEM_MAX_PHYSICAL_BYTES` from the
    /// environment, the heap's and the devices' variables left to their own readers, so
    /// garbage there never makes the host pool unusable.
    #[cfg_attr(ndmem_loom, allow(dead_code))]
    pub(crate) fn pool_from_env() -> Result<Limits, ConfigError> {
        Self::from_lookup(|name| {
            if name == ENV_MAX_BYTES || name == ENV_MAX_PHYSICAL_BYTES {
                env_value(name)
            } else {
                Ok(None)
            }
        })
    }

    /// [`Limits::from_env`] over any source of variables (tests, configuration files).
    pub fn from_lookup(
        mut lookup: impl FnMut(&str) -> Result<Option<String>, ConfigError>,
    ) -> Result<Limits, ConfigError> {
        let mut read = |name: &str| -> Result<Option<Option<usize>>, ConfigError> {
            lookup(name)?
                .map(|value| parse_size_named(name, &value).map(limit_of))
                .transpose()
        };
        let mut builder = Limits::builder();
        let mut from_env = LimitSources::default_all();
        if let Some(v) = read(ENV_MAX_HEAP)? {
            builder.max_heap = Some(v);
            from_env.max_heap = LimitSource::Environment;
        }
        if let Some(v) = read(ENV_MAX_BYTES)? {
            builder.max_bytes = Some(v);
            from_env.max_bytes = LimitSource::Environment;
        }
        if let Some(v) = read(ENV_MAX_PHYSICAL_BYTES)? {
            builder.max_physical_bytes = Some(v);
            from_env.max_physical_bytes = LimitSource::Environment;
        }
        if let Some(value) = lookup(ENV_MAX_DEVICE_BYTES)? {
            builder.max_device_bytes = Some(parse_device_size(&value)?);
            from_env.max_device_bytes = LimitSource::Environment;
        }
        let mut limits = builder.build();
        limits.sources = from_env;
        Ok(limits)
    }

    /// A builder whose unset fields take the defaults of semantics §1.
    pub fn builder() -> LimitsBuilder {
        LimitsBuilder::default()
    }

    /// No limit at all: every figure is tracked, nothing is refused.
    pub fn unlimited() -> Limits {
        Limits {
            max_heap: None,
            max_bytes: None,
            max_physical_bytes: None,
            max_device_bytes: None,
            sources: LimitSources {
                max_heap: LimitSource::Explicit,
                max_bytes: LimitSource::Explicit,
                max_physical_bytes: LimitSource::Explicit,
                max_device_bytes: LimitSource::Explicit,
            },
        }
    }

    /// The default off-heap budget: half of physical RAM.
    pub fn default_max_bytes() -> usize {
        physical_ram() / 2
    }

    /// The default physical budget for an off-heap budget: `max_bytes` + 1/4 of RAM, capped
    /// at 90% of RAM.
    pub fn default_max_physical_bytes(max_bytes: Option<usize>) -> usize {
        let ram = physical_ram();
        let cap = ram / 10 * 9;
        max_bytes.map_or(cap, |m| m.saturating_add(ram / 4).min(cap))
    }
}

/// Why a value that is not Unicode is no size (the allocator's warning says the same).
pub(crate) const NOT_UTF8: SizeError = "it is not valid UTF-8 (invalid bytes shown as U+FFFD)";

/// The value of the environment variable `name`, `None` when unset. A value that is not
/// Unicode is an error naming the variable and showing the value (invalid bytes as U+FFFD).
pub(crate) fn env_value(name: &str) -> Result<Option<String>, ConfigError> {
    match std::env::var(name) {
        Ok(value) => Ok(Some(value)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(value)) => Err(ConfigError::InvalidSize {
            variable: name.into(),
            value: value.to_string_lossy().into_owned(),
            reason: NOT_UTF8,
        }),
    }
}

impl LimitSources {
    fn default_all() -> LimitSources {
        LimitSources {
            max_heap: LimitSource::Default,
            max_bytes: LimitSource::Default,
            max_physical_bytes: LimitSource::Default,
            max_device_bytes: LimitSource::Default,
        }
    }
}

/// A host budget of `bytes`: `None` (unlimited) for 0 and for [`UNLIMITED`] (4 EiB) or
/// more, which no allocation can reach (semantics §1), so that a figure shown is a limit in
/// force.
fn limit_of(bytes: usize) -> Option<usize> {
    (bytes > 0 && bytes < UNLIMITED).then_some(bytes)
}

/// Builds [`Limits`]; `Some(0)` or `None` for a field means "unlimited" once set explicitly,
/// as does a heap, off-heap or physical budget of 4 EiB or more.
#[derive(Debug, Clone, Default)]
pub struct LimitsBuilder {
    max_heap: Option<Option<usize>>,
    max_bytes: Option<Option<usize>>,
    max_physical_bytes: Option<Option<usize>>,
    max_device_bytes: Option<Option<usize>>,
}

impl LimitsBuilder {
    /// Heap budget in bytes (`None`, 0 or 4 EiB and more: tracked only).
    pub fn max_heap(mut self, bytes: impl Into<Option<usize>>) -> Self {
        self.max_heap = Some(bytes.into().and_then(limit_of));
        self
    }

    /// Off-heap budget in bytes (`None`, 0 or 4 EiB and more: unlimited).
    pub fn max_bytes(mut self, bytes: impl Into<Option<usize>>) -> Self {
        self.max_bytes = Some(bytes.into().and_then(limit_of));
        self
    }

    /// Physical (RSS) budget in bytes (`None`, 0 or 4 EiB and more: unlimited).
    pub fn max_physical_bytes(mut self, bytes: impl Into<Option<usize>>) -> Self {
        self.max_physical_bytes = Some(bytes.into().and_then(limit_of));
        self
    }

    /// Per-device budget in bytes (`None`, 0 or 4 EiB and more: no figure in bytes, as
    /// [`Limits::max_device_bytes`] says).
    pub fn max_device_bytes(mut self, bytes: impl Into<Option<usize>>) -> Self {
        self.max_device_bytes = Some(bytes.into().and_then(limit_of));
        self
    }

    /// The limits, defaults filled in for fields never set.
    pub fn build(self) -> Limits {
        let source = |set: bool| {
            if set {
                LimitSource::Explicit
            } else {
                LimitSource::Default
            }
        };
        let max_bytes = self
            .max_bytes
            .unwrap_or_else(|| Some(Limits::default_max_bytes()));
        let max_physical_bytes = self
            .max_physical_bytes
            .unwrap_or_else(|| Some(Limits::default_max_physical_bytes(max_bytes)));
        Limits {
            max_heap: self.max_heap.flatten(),
            max_bytes,
            max_physical_bytes,
            max_device_bytes: self.max_device_bytes.flatten(),
            sources: LimitSources {
                max_heap: source(self.max_heap.is_some()),
                max_bytes: source(self.max_bytes.is_some()),
                max_physical_bytes: source(self.max_physical_bytes.is_some()),
                max_device_bytes: source(self.max_device_bytes.is_some()),
            },
        }
    }
}

#[cfg(all(test, not(ndmem_loom)))]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn sizes_parse_as_binary_multiples() {
        // Semantics §1: 123, 64K, 512M, 8G, 1T, case-insensitive, optional B / iB.
        assert_eq!(parse_size("123").unwrap(), 123);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("64k").unwrap(), 64 << 10);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("512mb").unwrap(), 512 << 20);
        assert_eq!(parse_size("8G").unwrap(), 8 << 30);
        assert_eq!(parse_size("8GiB").unwrap(), 8 << 30);
        assert_eq!(parse_size("1T").unwrap(), 1 << 40);
        assert_eq!(parse_size("100B").unwrap(), 100);
        assert_eq!(parse_size(" 2 G ").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("0").unwrap(), 0);
    }

    #[test]
    fn percentages_are_of_physical_ram() {
        let ram = physical_ram();
        assert_eq!(parse_size("50%").unwrap(), ram / 2);
        assert_eq!(parse_size("100%").unwrap(), ram);
        assert_eq!(
            parse_size("12.5%").unwrap(),
            (ram as u128 * 125 / 1000) as usize
        );
    }

    #[test]
    fn garbage_is_an_error_naming_the_value() {
        for bad in [
            "8X",
            "-1",
            "1.5.G",
            "",
            "  ",
            "G",
            "1.G",
            ".",
            "99999999999999999999999",
            "16E",
            "1.5",
            "101%",
            "1e9",
            "12 MBs",
            "0x10",
            "1,000",
        ] {
            let err = parse_size(bad).expect_err(bad);
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
        assert!(parse_size("16777216T").is_err(), "2^64 overflows");
        // Up to 18 decimal places (exact integer arithmetic), and the reason past them.
        assert_eq!(parse_size("1.000000000000000000K").unwrap(), 1024);
        assert_eq!(parse_size("20.000000000000000000").unwrap(), 20);
        assert_eq!(parse_size("20.000000000000000000K").unwrap(), 20 << 10);
        assert_eq!(parse_size("2048.0000000000000000").unwrap(), 2048);
        assert_eq!(parse_size("1.000000000000000001P").unwrap(), 1 << 50);
        assert_eq!(
            parse_size("50.000000000000000000%").unwrap(),
            parse_size("50%").unwrap()
        );
        assert_eq!(
            parse_size("33.333333333333333333%").unwrap(),
            (physical_ram() as u128 * 33_333_333_333_333_333_333 / 10u128.pow(20)) as usize
        );
        assert!(
            parse_size("18446744073709551616").is_err(),
            "2^64 overflows"
        );
        let err = parse_size("1.0000000000000000000K").unwrap_err();
        assert!(err.to_string().contains("too many decimal places"), "{err}");
    }

    #[test]
    fn a_nonzero_size_that_rounds_to_zero_bytes_is_an_error_not_unlimited() {
        // 0 means "no limit"; a tiny non-zero request must not silently become that.
        for tiny in [
            "0.000000000001%",
            "0.000000000000000001%",
            "0.0001K",
            "0.0000000001G",
        ] {
            let err = parse_size(tiny).expect_err(tiny);
            let msg = err.to_string();
            assert!(msg.contains(&format!("{tiny:?}")), "{msg}");
            assert!(msg.contains("0 means no limit"), "{msg}");
        }
        assert_eq!(parse_size("0%").unwrap(), 0);
        assert_eq!(parse_size("0.0K").unwrap(), 0);
        assert_eq!(parse_size("0.001K").unwrap(), 1);
    }

    #[cfg(unix)]
    #[test]
    fn a_value_that_is_not_unicode_is_named_with_its_text() {
        use std::os::unix::ffi::OsStrExt;
        // A variable unique to this test, so no other test reads it.
        let name = "NDMEM_TEST_NOT_UNICODE_VALUE";
        assert_eq!(env_value(name), Ok(None));
        std::env::set_var(name, std::ffi::OsStr::from_bytes(b"64\xffM"));
        let result = env_value(name);
        std::env::remove_var(name);
        let msg = result.unwrap_err().to_string();
        assert!(msg.contains(name), "{msg}");
        assert!(msg.contains("\"64\u{fffd}M\""), "{msg}");
        assert!(msg.contains("not valid UTF-8"), "{msg}");
    }

    #[test]
    fn defaults_follow_semantics_1() {
        let env: HashMap<&str, &str> = HashMap::new();
        let limits = Limits::from_lookup(|n| Ok(env.get(n).map(|v| v.to_string()))).unwrap();
        let ram = physical_ram();
        assert_eq!(limits.max_heap, None);
        assert_eq!(limits.max_bytes, Some(ram / 2));
        assert_eq!(
            limits.max_physical_bytes,
            Some((ram / 2 + ram / 4).min(ram / 10 * 9))
        );
        assert_eq!(limits.sources.max_bytes, LimitSource::Default);
    }

    #[test]
    fn environment_values_override_defaults_and_zero_means_unlimited() {
        let env = HashMap::from([
            (ENV_MAX_BYTES, "1G"),
            (ENV_MAX_HEAP, "256M"),
            (ENV_MAX_PHYSICAL_BYTES, "0"),
        ]);
        let limits = Limits::from_lookup(|n| Ok(env.get(n).map(|v| v.to_string()))).unwrap();
        assert_eq!(limits.max_bytes, Some(1 << 30));
        assert_eq!(limits.max_heap, Some(256 << 20));
        assert_eq!(limits.max_physical_bytes, None);
        assert_eq!(limits.sources.max_bytes, LimitSource::Environment);
        assert_eq!(limits.sources.max_device_bytes, LimitSource::Default);
    }

    #[test]
    fn a_limit_of_4_eib_or_more_is_no_limit_as_the_budgets_treat_it() {
        // Semantics §1: 4 EiB (2^62) and more mean no limit, so `Limits` shows none.
        let env = HashMap::from([
            (ENV_MAX_BYTES, "4096P"),
            (ENV_MAX_HEAP, "8191P"),
            (ENV_MAX_PHYSICAL_BYTES, "4095P"),
            (ENV_MAX_DEVICE_BYTES, "9223372036854775807"),
        ]);
        let limits = Limits::from_lookup(|n| Ok(env.get(n).map(|v| v.to_string()))).unwrap();
        assert_eq!(limits.max_bytes, None);
        assert_eq!(limits.max_device_bytes, None);
        assert_eq!(limits.sources.max_device_bytes, LimitSource::Environment);
        assert_eq!(limits.max_heap, None);
        assert_eq!(limits.max_physical_bytes, Some(4095 << 50));
        assert_eq!(limits.sources.max_bytes, LimitSource::Environment);
        let built = Limits::builder()
            .max_heap(usize::MAX)
            .max_bytes(UNLIMITED)
            .max_physical_bytes(UNLIMITED - 1)
            .max_device_bytes(UNLIMITED)
            .build();
        assert_eq!(
            (built.max_heap, built.max_bytes, built.max_physical_bytes),
            (None, None, Some(UNLIMITED - 1))
        );
        assert_eq!(built.max_device_bytes, None);
    }

    #[test]
    fn garbage_in_a_variable_names_the_variable_and_value() {
        let env = HashMap::from([(ENV_MAX_PHYSICAL_BYTES, "lots")]);
        let err = Limits::from_lookup(|n| Ok(env.get(n).map(|v| v.to_string()))).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("NDMEM_MAX_PHYSICAL_BYTES"), "{msg}");
        assert!(msg.contains("\"lots\""), "{msg}");
    }

    #[test]
    fn a_percentage_over_100_names_what_it_is_a_share_of() {
        // RAM for the host budgets, each device's memory for the device budget.
        assert!(parse_size("150%")
            .unwrap_err()
            .to_string()
            .contains("a percentage of RAM cannot exceed 100%"));
        let ram = "a percentage of RAM cannot exceed 100%";
        let device = "a percentage of each device's memory cannot exceed 100%";
        for (name, wording) in [
            (ENV_MAX_HEAP, ram),
            (ENV_MAX_BYTES, ram),
            (ENV_MAX_PHYSICAL_BYTES, ram),
            (ENV_MAX_DEVICE_BYTES, device),
        ] {
            let env = HashMap::from([(name, "150%")]);
            let msg = Limits::from_lookup(|n| Ok(env.get(n).map(|v| v.to_string())))
                .unwrap_err()
                .to_string();
            assert!(msg.contains(name), "{msg}");
            assert!(msg.contains("\"150%\""), "{msg}");
            assert!(msg.contains(wording), "{msg}");
            if wording == device {
                assert!(!msg.contains("RAM"), "{msg}");
            }
        }
    }

    #[test]
    fn a_device_percentage_is_left_to_the_device_not_judged_against_ram() {
        // 1e-10 % of RAM is less than a byte; of a large device it is a limit. The host only
        // checks the form.
        // Trailing zeros of the fraction say nothing, however many (the device drops them
        // too).
        for percent in [
            "0.0000000001%",
            "50%",
            " 12.5 %",
            "0%",
            "50.0000000000000000000%",
            "50.5000000000000000000000%",
        ] {
            let env = HashMap::from([(ENV_MAX_DEVICE_BYTES, percent)]);
            let limits = Limits::from_lookup(|n| Ok(env.get(n).map(|v| v.to_string())))
                .unwrap_or_else(|e| panic!("{percent}: {e}"));
            assert_eq!(limits.max_device_bytes, None, "{percent}");
            assert_eq!(limits.sources.max_device_bytes, LimitSource::Environment);
        }
        for bad in ["150%", "x%", "%", "-1%", "0.0000000000001%", "1.5.2%"] {
            let env = HashMap::from([(ENV_MAX_DEVICE_BYTES, bad)]);
            let msg = Limits::from_lookup(|n| Ok(env.get(n).map(|v| v.to_string())))
                .unwrap_err()
                .to_string();
            assert!(
                msg.contains(&format!("{ENV_MAX_DEVICE_BYTES}={bad:?}")),
                "{msg}"
            );
        }
        let env = HashMap::from([(ENV_MAX_DEVICE_BYTES, "1G")]);
        let limits = Limits::from_lookup(|n| Ok(env.get(n).map(|v| v.to_string()))).unwrap();
        assert_eq!(limits.max_device_bytes, Some(1 << 30));
    }

    #[test]
    fn builder_derives_physical_from_max_bytes() {
        let ram = physical_ram();
        let limits = Limits::builder().max_bytes(1 << 20).build();
        assert_eq!(limits.max_bytes, Some(1 << 20));
        assert_eq!(
            limits.max_physical_bytes,
            Some(((1 << 20) + ram / 4).min(ram / 10 * 9))
        );
        assert_eq!(limits.sources.max_bytes, LimitSource::Explicit);
        assert_eq!(limits.sources.max_physical_bytes, LimitSource::Default);
    }
}
