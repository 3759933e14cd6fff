//! [`Share`]: a fraction of time (a stall share, a threshold on one), `0.0..=1.0`, comparable and
//! usable in configuration types that are `Eq`.

use serde::{Deserialize, Serialize};

/// A share in `0.0..=1.0` as a whole percentage (`0.314` → 31), clamped to `0..=100`.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "a share in 0..=1 as a whole percentage"
)]
#[must_use]
pub fn percent(share: f64) -> u32 {
    (share * 100.0).round().clamp(0.0, 100.0) as u32
}

/// A fraction in `0.0..=1.0` (never NaN: checked when parsed, clamped when built).
#[derive(Clone, Copy, Debug, Default, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct Share(f64);

/// A `Share` is never NaN, so equality is total.
impl Eq for Share {}

impl Share {
    /// `value` clamped to `0.0..=1.0` (NaN is 0).
    #[must_use]
    pub fn new(value: f64) -> Self {
        if value.is_nan() {
            Self(0.0)
        } else {
            Self(value.clamp(0.0, 1.0))
        }
    }

    #[must_use]
    pub fn get(self) -> f64 {
        self.0
    }
}

/// A number that is not a share (outside `0.0..=1.0`, or NaN).
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[error("{value} is not a share within 0.0..=1.0")]
pub struct ShareError {
    pub value: f64,
}

impl TryFrom<f64> for Share {
    type Error = ShareError;

    fn try_from(value: f64) -> Result<Self, ShareError> {
        if (0.0..=1.0).contains(&value) {
            Ok(Self(value))
        } else {
            Err(ShareError { value })
        }
    }
}

impl From<Share> for f64 {
    fn from(s: Share) -> f64 {
        s.0
    }
}

/// A number within `0.0..=1.0` (the configuration's schema; `try_from` checks the same).
impl schemars::JsonSchema for Share {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Share".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "number", "minimum": 0.0, "maximum": 1.0 })
    }
}

impl std::fmt::Display for Share {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_within_range_only() {
        assert_eq!(Share::try_from(0.05), Ok(Share::new(0.05)));
        assert_eq!(
            Share::try_from(1.5).unwrap_err().to_string(),
            "1.5 is not a share within 0.0..=1.0"
        );
        assert!(Share::try_from(f64::NAN).is_err());
        assert!(Share::new(f64::NAN).get().abs() < f64::EPSILON);
        assert!((Share::new(2.0).get() - 1.0).abs() < f64::EPSILON);
    }
}
