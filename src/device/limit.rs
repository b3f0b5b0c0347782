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
    /// `scaled / denominator` percent of the device's memory (`12.5%` is 125 / 10).
    Percent {
        /// The percentage times `denominator`.
        scaled: u64,
        /// A power of ten.
        denominator: u64,
    },
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
            if fraction.len() > 12 || whole.len() > 4 {
                return Err(invalid(text, "it has too many digits"));
            }
            let scaled: u64 = format!("{whole}{fraction}")
                .parse()
                .map_err(|_| invalid(text, "it does not start with a number"))?;
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
    /// `max_bytes` (`None`: unlimited); `None` is no limit. A percentage of less than one
    /// byte of the device is an error (0 means no limit; a tiny limit is not that).
    pub fn resolve(
        &self,
        device_memory: usize,
        max_bytes: Option<usize>,
    ) -> Result<Option<usize>, ConfigError> {
        Ok(match *self {
            DeviceLimit::Default => {
                let ninety = device_memory / 10 * 9 + device_memory % 10 * 9 / 10;
                Some(max_bytes.map_or(ninety, |m| m.min(ninety)))
            }
            DeviceLimit::Unlimited => None,
            DeviceLimit::Bytes(bytes) => Some(bytes),
            DeviceLimit::Percent {
                scaled,
                denominator,
            } => {
                let bytes = device_memory as u128 * scaled as u128 / (100 * denominator as u128);
                if bytes == 0 {
                    return Err(invalid(
                        &self.to_string(),
                        "the percentage is less than one byte of the device (0 means no limit)",
                    ));
                }
                Some(bytes as usize)
            }
        })
    }
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
                let places = denominator.max(1).ilog10();
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
    fn default_is_min_of_max_bytes_and_ninety_percent() {
        let d = DeviceLimit::Default;
        assert_eq!(d.resolve(1000, None).unwrap(), Some(900));
        assert_eq!(d.resolve(1000, Some(100)).unwrap(), Some(100));
        assert_eq!(d.resolve(1000, Some(5000)).unwrap(), Some(900));
        assert_eq!(d.resolve(1001, None).unwrap(), Some(900));
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
