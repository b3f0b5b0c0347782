//! The per-device budget (semantics §1, §5): `NDMEM_MAX_DEVICE_BYTES` as a size, or as a
//! percentage **of that device's memory**, resolved once per device when it is opened.
//!
//! Invariant: resolution is pure: the same text, device memory and host `max_bytes` always
//! give the same limit. Unset means min(`max_bytes`, 90% of the device); `0` (or `0%`)
//! means no limit of ndmem's own (the driver's memory still bounds it).

#![forbid(unsafe_code)]

use ndmem_alloc::{parse_size, ConfigError, ENV_MAX_DEVICE_BYTES};

/// How a device's budget is given, before it is resolved against the device's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceLimit {
    /// min(`max_bytes` of the host pool, 90% of the device's memory) (semantics §1).
    #[default]
    Default,
    /// No limit of ndmem's own.
    Unlimited,
    /// A number of bytes.
    Bytes(usize),
    /// `scaled / denominator` percent of the device's memory (`12.5%` is 125 / 10), at
    /// most 100%; `scaled` 0 is no limit.
    Percent {
        /// The percentage times `denominator`.
        scaled: u64,
        /// Not zero; a power of ten when parsed (any other value prints with three
        /// significant digits: 1 / 3 is `0.333%`).
        denominator: u64,
    },
}

/// The bytes of `scaled / denominator` percent of `device_memory` (`denominator` > 0).
fn percent_of(device_memory: usize, scaled: u64, denominator: u64) -> u128 {
    // Fits: both factors are below 2^64.
    device_memory as u128 * u128::from(scaled) / (100 * u128::from(denominator))
}

fn invalid(value: &str, reason: &'static str) -> ConfigError {
    ConfigError::InvalidSize {
        variable: ENV_MAX_DEVICE_BYTES.into(),
        value: value.into(),
        reason,
    }
}

impl DeviceLimit {
    /// Parses a value of `NDMEM_MAX_DEVICE_BYTES`: a size as in semantics §1 (`8G`), or
    /// `NN%` of the device's memory; `0` is no limit.
    ///
    /// ```
    /// use ndmem::device::DeviceLimit;
    /// assert_eq!(DeviceLimit::parse("1G").unwrap(), DeviceLimit::Bytes(1 << 30));
    /// assert_eq!(DeviceLimit::parse("0").unwrap(), DeviceLimit::Unlimited);
    /// assert_eq!(DeviceLimit::parse("50%").unwrap().resolve(1000, None).unwrap(), Some(500));
    /// assert!(DeviceLimit::parse("101%").is_err());
    /// ```
    pub fn parse(text: &str) -> Result<DeviceLimit, ConfigError> {
        let trimmed = text.trim();
        if let Some(number) = trimmed.strip_suffix('%') {
            let number = number.trim_end();
            let (whole, fraction) = match number.split_once('.') {
                Some((w, f)) => (w, f),
                None => (number, ""),
            };
            let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
            if whole.is_empty() && fraction.is_empty()
                || !digits(whole)
                || !digits(fraction)
                || number.ends_with('.')
            {
                return Err(invalid(text, "a percentage must be a number followed by %"));
            }
            // Leading zeros of the whole part and trailing ones of the fraction say nothing
            // (`050%` is `50%`).
            let (whole, fraction) = (
                whole.trim_start_matches('0'),
                fraction.trim_end_matches('0'),
            );
            if fraction.len() > 12 || whole.len() > 4 {
                return Err(invalid(text, "it has too many digits"));
            }
            let scaled: u64 = match format!("{whole}{fraction}").as_str() {
                "" => 0,
                digits => digits
                    .parse()
                    .map_err(|_| invalid(text, "it does not start with a number"))?,
            };
            let denominator = 10u64.pow(fraction.len() as u32);
            if scaled > 100 * denominator {
                return Err(invalid(
                    text,
                    "a percentage of the device's memory cannot exceed 100%",
                ));
            }
            if scaled == 0 {
                return Ok(DeviceLimit::Unlimited);
            }
            return Ok(DeviceLimit::Percent {
                scaled,
                denominator,
            });
        }
        match parse_size(text) {
            Ok(0) => Ok(DeviceLimit::Unlimited),
            Ok(bytes) => Ok(DeviceLimit::Bytes(bytes)),
            Err(ConfigError::InvalidSize { reason, .. }) => Err(invalid(text, reason)),
            Err(other) => Err(other),
        }
    }

    /// `NDMEM_MAX_DEVICE_BYTES` from the environment; unset is [`DeviceLimit::Default`].
    pub fn from_env() -> Result<DeviceLimit, ConfigError> {
        match std::env::var(ENV_MAX_DEVICE_BYTES) {
            Ok(value) => DeviceLimit::parse(&value),
            Err(std::env::VarError::NotPresent) => Ok(DeviceLimit::Default),
            Err(std::env::VarError::NotUnicode(value)) => Err(ConfigError::InvalidSize {
                variable: ENV_MAX_DEVICE_BYTES.into(),
                value: value.to_string_lossy().into_owned(),
                reason: "it is not valid UTF-8 (invalid bytes shown as U+FFFD)",
            }),
        }
    }

    /// The limit in bytes for a device with `device_memory` bytes whose host pool allows
    /// `max_bytes` (`None`: unlimited); `None` is no limit (`Bytes(0)`, a percentage of
    /// 0, and 4 EiB or more are no limit too, as in the variable). An error, naming
    /// `NDMEM_MAX_DEVICE_BYTES`, for what the variable would refuse: a percentage over a
    /// denominator of 0, above 100%, or of less than one byte of the device (0 means no
    /// limit; a tiny limit is not that), and more than `isize::MAX` bytes.
    ///
    /// ```
    /// use ndmem::device::DeviceLimit;
    /// assert_eq!(DeviceLimit::Bytes(0).resolve(1000, None).unwrap(), None);
    /// let third = DeviceLimit::Percent { scaled: 1, denominator: 3 };
    /// assert_eq!(third.resolve(3000, None).unwrap(), Some(10));
    /// assert!(DeviceLimit::Percent { scaled: 1, denominator: 0 }.resolve(1000, None).is_err());
    /// assert!(DeviceLimit::Percent { scaled: 101, denominator: 1 }.resolve(1000, None).is_err());
    /// ```
    pub fn resolve(
        &self,
        device_memory: usize,
        max_bytes: Option<usize>,
    ) -> Result<Option<usize>, ConfigError> {
        self.resolve_as(device_memory, max_bytes, None)
    }

    /// [`DeviceLimit::resolve`], with errors naming `setting` (where a limit given in
    /// code was set, e.g. `SimConfig::limit`) and the value as written in code, or the
    /// variable when `setting` is `None`.
    pub(crate) fn resolve_as(
        &self,
        device_memory: usize,
        max_bytes: Option<usize>,
        setting: Option<&str>,
    ) -> Result<Option<usize>, ConfigError> {
        self.check(device_memory, setting)?;
        Ok(match *self {
            DeviceLimit::Default => {
                let ninety = device_memory / 10 * 9 + device_memory % 10 * 9 / 10;
                Some(max_bytes.map_or(ninety, |m| m.min(ninety)))
            }
            DeviceLimit::Unlimited
            | DeviceLimit::Bytes(0)
            | DeviceLimit::Percent { scaled: 0, .. } => None,
            // 4 EiB or more is no limit, as for every limit (semantics §1).
            DeviceLimit::Bytes(bytes) if bytes >= ndmem_alloc::counter::UNLIMITED => None,
            DeviceLimit::Bytes(bytes) => Some(bytes),
            DeviceLimit::Percent {
                scaled,
                denominator,
            } => Some(percent_of(device_memory, scaled, denominator) as usize),
        })
    }

    /// Refuses what `NDMEM_MAX_DEVICE_BYTES` would refuse, for a device of
    /// `device_memory` bytes; the error names `setting` (or the variable, when `None`).
    /// Pure arithmetic: it never divides by zero and never panics.
    pub(crate) fn check(
        &self,
        device_memory: usize,
        setting: Option<&str>,
    ) -> Result<(), ConfigError> {
        let reason = match *self {
            DeviceLimit::Bytes(bytes) if bytes > isize::MAX as usize => {
                "it is more than isize::MAX bytes (DeviceLimit::Unlimited is no limit)"
            }
            DeviceLimit::Percent { denominator: 0, .. } => {
                "the denominator of a percentage cannot be 0 (12.5% is 125 over 10)"
            }
            DeviceLimit::Percent {
                scaled,
                denominator,
            } if u128::from(scaled) > 100 * u128::from(denominator) => {
                "a percentage of the device's memory cannot exceed 100%"
            }
            DeviceLimit::Percent {
                scaled,
                denominator,
            } if scaled != 0 && percent_of(device_memory, scaled, denominator) == 0 => {
                "the percentage is less than one byte of the device (0 means no limit)"
            }
            _ => return Ok(()),
        };
        Err(match setting {
            None => invalid(&self.to_string(), reason),
            Some(setting) => ConfigError::Invalid {
                variable: setting.into(),
                message: format!(
                    "DeviceLimit::{self:?} (of a device of {device_memory} bytes) is refused: {reason}"
                ),
            },
        })
    }
}

/// Writes `scaled / denominator` (`denominator` > 0, not a power of ten) with three
/// significant digits, rounded half up, trailing zeros dropped: 1 / 3 is `0.333`.
fn write_decimal(
    f: &mut std::fmt::Formatter<'_>,
    scaled: u64,
    denominator: u64,
) -> std::fmt::Result {
    let d = u128::from(denominator);
    let mut whole = u128::from(scaled) / d;
    let rem = u128::from(scaled) % d;
    if rem == 0 {
        return write!(f, "{whole}");
    }
    let places = if whole > 0 {
        3u32.saturating_sub(whole.ilog10() + 1)
    } else {
        // Zeros after the point before the first significant digit, then three digits.
        let mut zeros = 0;
        while rem * 10u128.pow(zeros + 1) < d {
            zeros += 1;
        }
        zeros + 3
    };
    // Long division: every step stays below 10 * 2^64.
    let (mut digits, mut r) = (0u128, rem);
    for _ in 0..places {
        r *= 10;
        digits = digits * 10 + r / d;
        r %= d;
    }
    if 2 * r >= d {
        digits += 1;
    }
    if digits == 10u128.pow(places) {
        whole += 1;
        digits = 0;
    }
    if digits == 0 {
        return write!(f, "{whole}");
    }
    let text = format!("{digits:0width$}", width = places as usize);
    write!(f, "{whole}.{}", text.trim_end_matches('0'))
}

impl std::fmt::Display for DeviceLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            DeviceLimit::Default => f.write_str("default"),
            DeviceLimit::Unlimited => f.write_str("0"),
            DeviceLimit::Bytes(b) => write!(f, "{b}"),
            DeviceLimit::Percent {
                scaled,
                denominator,
            } => {
                if denominator == 0 {
                    // Refused by `resolve`; printed as given.
                    return write!(f, "{scaled}/0%");
                }
                let places = denominator.ilog10();
                if 10u64.pow(places) != denominator {
                    write_decimal(f, scaled, denominator)?;
                    return f.write_str("%");
                }
                let whole = scaled / denominator;
                let fraction = scaled % denominator;
                if places == 0 {
                    write!(f, "{whole}%")
                } else {
                    write!(f, "{whole}.{fraction:0places$}%", places = places as usize)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_percentages_of_the_device() {
        assert_eq!(
            DeviceLimit::parse("64M").unwrap(),
            DeviceLimit::Bytes(64 << 20)
        );
        assert_eq!(DeviceLimit::parse(" 0 ").unwrap(), DeviceLimit::Unlimited);
        assert_eq!(DeviceLimit::parse("0%").unwrap(), DeviceLimit::Unlimited);
        let half = DeviceLimit::parse("50%").unwrap();
        assert_eq!(
            half.resolve(80 << 30, Some(1 << 30)).unwrap(),
            Some(40 << 30)
        );
        let eighth = DeviceLimit::parse("12.5%").unwrap();
        assert_eq!(eighth.resolve(8000, None).unwrap(), Some(1000));
        assert_eq!(eighth.to_string(), "12.5%");
        assert_eq!(
            DeviceLimit::parse("100%")
                .unwrap()
                .resolve(77, None)
                .unwrap(),
            Some(77)
        );
    }

    #[test]
    fn zeros_that_say_nothing_do_not_count_as_digits() {
        for (text, same_as) in [
            ("00050%", "50%"),
            ("012.50000000000000%", "12.5%"),
            ("0000.0%", "0%"),
        ] {
            assert_eq!(
                DeviceLimit::parse(text).unwrap(),
                DeviceLimit::parse(same_as).unwrap(),
                "{text}"
            );
            crate::alloc::Limits::from_lookup(|n| {
                Ok((n == crate::alloc::ENV_MAX_DEVICE_BYTES).then(|| text.to_string()))
            })
            .unwrap();
        }
        for text in ["12345%", "0.1234567890123%"] {
            let e = DeviceLimit::parse(text).unwrap_err().to_string();
            assert!(e.contains("too many digits"), "{text}: {e}");
        }
    }

    #[test]
    fn default_is_min_of_max_bytes_and_ninety_percent() {
        let d = DeviceLimit::Default;
        assert_eq!(d.resolve(1000, None).unwrap(), Some(900));
        assert_eq!(d.resolve(1000, Some(100)).unwrap(), Some(100));
        assert_eq!(d.resolve(1000, Some(5000)).unwrap(), Some(900));
        assert_eq!(d.resolve(1001, None).unwrap(), Some(900));
    }

    #[test]
    fn extreme_percentages_print_and_resolve_without_panicking() {
        let max = u64::MAX;
        for (scaled, denominator, text) in [
            (1, max, None),
            (max, max - 1, Some("1%")),
            (max, 1, Some("18446744073709551615%")),
            (max, 3, None),
            (199, 2, Some("99.5%")),
            (1999, 2, Some("1000%")),
            (0, 3, Some("0%")),
        ] {
            let limit = DeviceLimit::Percent {
                scaled,
                denominator,
            };
            let printed = limit.to_string();
            if let Some(text) = text {
                assert_eq!(printed, text, "{limit:?}");
            }
            let _ = limit.resolve(usize::MAX, None);
        }
        let tiny = DeviceLimit::Percent {
            scaled: 1,
            denominator: max,
        };
        assert!(
            tiny.to_string().starts_with("0.0000000000000000000542"),
            "{tiny}"
        );
    }

    #[test]
    fn garbage_names_the_variable_and_value() {
        for bad in ["101%", "%", "1.%", "x%", "-5%", "8X", "", "1.5.2%"] {
            let msg = DeviceLimit::parse(bad).expect_err(bad).to_string();
            assert!(msg.contains(ENV_MAX_DEVICE_BYTES), "{msg}");
            assert!(msg.contains(&format!("{bad:?}")), "{msg}");
        }
        let tiny = DeviceLimit::parse("0.0001%").unwrap();
        assert!(tiny.resolve(100, None).is_err());
    }
}
