//! Quantities as people read and type them, in Kubernetes' notation: `500m`, `128Mi`, `66.6Mi`,
//! `2Gi`, `unlimited`. Every text a person reads (status, reasons, logs, the demo) uses these, and
//! every value a person types (the CLI, the config file) is read by [`parse_memory`] and
//! [`parse_cpu`], which take what Kubernetes' `resource.Quantity` takes (`1.5Gi`, `512Ki`,
//! `250m`, `0.5`, `1e3`, `2G`). What [`bytes_quantity`] and [`cpu_text`] print parses back to the
//! same value.

pub use crate::model::UNLIMITED_BYTES;

const KI: u64 = 1 << 10;
const MI: u64 = 1 << 20;
const GI: u64 = 1 << 30;

/// Bytes: whole `Gi` when exact, else `Mi` (one decimal when not whole), `Ki` below 1 MiB.
pub fn bytes_text(bytes: u64) -> String {
    if bytes >= GI && bytes % GI == 0 {
        format!("{}Gi", bytes / GI)
    } else if bytes >= MI {
        if bytes % MI == 0 {
            format!("{}Mi", bytes / MI)
        } else {
            let tenths = (bytes * 10 + MI / 2) / MI;
            if tenths % 10 == 0 {
                format!("{}Mi", tenths / 10)
            } else {
                format!("{}.{}Mi", tenths / 10, tenths % 10)
            }
        }
    } else if bytes >= KI {
        format!("{}Ki", bytes / KI)
    } else {
        bytes.to_string()
    }
}

/// A memory limit as the runtime and cgroups spell it: `-1`, `0` (unset) and values at or above
/// the kernel's "no limit" read as `unlimited`.
pub fn memory_limit_text(limit: i64) -> String {
    match u64::try_from(limit) {
        Ok(b) if b > 0 && b < UNLIMITED_BYTES => bytes_text(b),
        _ => "unlimited".to_string(),
    }
}

/// Bytes exactly, as Kubernetes writes a binary quantity: the largest of `Ei`..`Ki` that divides
/// it (`1536Mi`, `512Ki`), else plain bytes (`1000`). Parses back to the same value; for measured
/// figures where a rounded reading is kinder, see [`bytes_text`].
pub fn bytes_quantity(bytes: u64) -> String {
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes == 0 {
        return "0".to_string();
    }
    let mut best = None;
    for (i, suffix) in SUFFIXES.iter().enumerate() {
        let unit = 1u64 << (10 * (i + 1));
        if bytes % unit == 0 {
            best = Some((bytes / unit, *suffix));
        }
    }
    match best {
        Some((n, suffix)) => format!("{n}{suffix}"),
        None => bytes.to_string(),
    }
}

/// Why a quantity could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("{value:?} is not a Kubernetes quantity (e.g. {example})")]
    Syntax {
        value: String,
        example: &'static str,
    },
    #[error("{value:?} is negative")]
    Negative { value: String },
    #[error("{value:?} is too large")]
    TooLarge { value: String },
}

/// A memory quantity in bytes: `512Mi`, `1.5Gi`, `2G`, `1048576`, `1e9`. A fraction of a byte
/// rounds up, as Kubernetes' `Quantity.Value()` does.
pub fn parse_memory(text: &str) -> Result<u64, QuantityError> {
    parse_scaled(text, 1, "512Mi, 1.5Gi, 1073741824")
}

/// A CPU quantity in millicores: `250m`, `1.5`, `2`. A fraction of a millicore rounds up, as
/// Kubernetes' `Quantity.MilliValue()` does.
pub fn parse_cpu(text: &str) -> Result<u64, QuantityError> {
    parse_scaled(text, 1000, "250m, 1.5, 2")
}

/// `text` times `scale`, rounded up; Kubernetes' quantity grammar: a non-negative decimal number
/// and one optional suffix (binary `Ki`..`Ei`, decimal `n u m k M G T P E`, or an exponent
/// `e<n>`/`E<n>`).
fn parse_scaled(text: &str, scale: u128, example: &'static str) -> Result<u64, QuantityError> {
    let syntax = || QuantityError::Syntax {
        value: text.to_string(),
        example,
    };
    let too_large = || QuantityError::TooLarge {
        value: text.to_string(),
    };
    let s = text.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.starts_with('-') {
        return Err(QuantityError::Negative {
            value: text.to_string(),
        });
    }
    let number_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty())
        || fraction.contains('.')
        || whole.len() + fraction.len() > 30
    {
        return Err(syntax());
    }
    // numerator / denominator = the value in base units.
    let mut num: u128 = format!("{whole}{fraction}").parse().map_err(|_| syntax())?;
    let mut den: u128 = 10u128.pow(u32::try_from(fraction.len()).map_err(|_| syntax())?);
    let binary = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let exponent: i32 = if let Some(i) = binary.iter().position(|b| *b == suffix) {
        let shift = 10 * (u32::try_from(i).map_err(|_| syntax())? + 1);
        num = num.checked_mul(1u128 << shift).ok_or_else(too_large)?;
        0
    } else {
        match suffix {
            "" => 0,
            "n" => -9,
            "u" => -6,
            "m" => -3,
            "k" => 3,
            "M" => 6,
            "G" => 9,
            "T" => 12,
            "P" => 15,
            "E" => 18,
            e => {
                let digits = e
                    .strip_prefix('e')
                    .or_else(|| e.strip_prefix('E'))
                    .ok_or_else(syntax)?;
                let n: i32 = digits.parse().map_err(|_| syntax())?;
                if !(-30..=30).contains(&n) {
                    return Err(syntax());
                }
                n
            }
        }
    };
    if exponent >= 0 {
        num = num
            .checked_mul(10u128.pow(exponent.unsigned_abs()))
            .ok_or_else(too_large)?;
    } else {
        den = den
            .checked_mul(10u128.pow(exponent.unsigned_abs()))
            .ok_or_else(too_large)?;
    }
    num = num.checked_mul(scale).ok_or_else(too_large)?;
    u64::try_from(num.div_ceil(den)).map_err(|_| too_large())
}

/// A memory limit as [`memory_limit_text`] reads it, exactly ([`bytes_quantity`]): what
/// `nri-resize update --memory-limit` takes back.
pub fn memory_limit_exact_text(limit: i64) -> String {
    match u64::try_from(limit) {
        Ok(b) if b > 0 && b < UNLIMITED_BYTES => bytes_quantity(b),
        _ => "unlimited".to_string(),
    }
}

/// Millicores: `500m`.
pub fn cpu_text(millis: u64) -> String {
    format!("{millis}m")
}

/// A CFS quota over a period as millicores; `unlimited` for no quota.
pub fn cpu_quota_text(quota: i64, period: u64) -> String {
    match u64::try_from(quota) {
        Ok(q) if q > 0 && period > 0 => cpu_text(q.saturating_mul(1000) / period),
        _ => "unlimited".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_as_kubernetes_quantities() {
        assert_eq!(bytes_text(128 * MI), "128Mi");
        assert_eq!(bytes_text(69_828_608), "66.6Mi");
        assert_eq!(bytes_text(2 * GI), "2Gi");
        assert_eq!(bytes_text(GI + GI / 2), "1536Mi");
        assert_eq!(bytes_text(512 * KI), "512Ki");
        assert_eq!(bytes_text(100), "100");
        assert_eq!(bytes_text(MI + 10), "1Mi");
    }

    #[test]
    fn memory_quantities_parse_as_kubernetes_reads_them() {
        for (text, bytes) in [
            ("512Ki", 512 * KI),
            ("1.5Gi", GI + GI / 2),
            ("128Mi", 128 * MI),
            ("1Ti", 1 << 40),
            ("2G", 2_000_000_000),
            ("1k", 1000),
            ("1e3", 1000),
            ("1E3", 1000),
            ("1073741824", GI),
            ("0", 0),
            ("+5", 5),
            ("0.5", 1),
            ("1500m", 2),
            (".5Ki", 512),
            (" 64Mi ", 64 * MI),
        ] {
            assert_eq!(parse_memory(text), Ok(bytes), "{text}");
        }
        for bad in [
            "", "Mi", "1.2.3Mi", "12Xi", "1MiB", "1 Mi", "lots", "1e", "1e99", ".",
        ] {
            assert!(
                matches!(parse_memory(bad), Err(QuantityError::Syntax { .. })),
                "{bad:?}"
            );
        }
        assert!(matches!(
            parse_memory("-1Mi"),
            Err(QuantityError::Negative { .. })
        ));
        assert!(matches!(
            parse_memory("99999999Ei"),
            Err(QuantityError::TooLarge { .. })
        ));
    }

    #[test]
    fn cpu_quantities_parse_to_millicores() {
        for (text, millis) in [
            ("250m", 250),
            ("1.5", 1500),
            ("2", 2000),
            ("0.1", 100),
            ("1500m", 1500),
            ("100000u", 100),
            ("0.0001", 1),
            ("1k", 1_000_000),
        ] {
            assert_eq!(parse_cpu(text), Ok(millis), "{text}");
        }
        for bad in ["", "m", "1.5 cores", "-1", "one"] {
            assert!(parse_cpu(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn printed_quantities_parse_back_to_the_same_value() {
        assert_eq!(bytes_quantity(GI + GI / 2), "1536Mi");
        assert_eq!(bytes_quantity(512 * KI), "512Ki");
        assert_eq!(bytes_quantity(1000), "1000");
        assert_eq!(bytes_quantity(0), "0");
        assert_eq!(bytes_quantity(69_828_608), "68192Ki");
        let mut b = 1u64;
        while b < u64::MAX / 3 {
            for v in [b, b - 1, b + 1, b * 3, b / 2 * 3] {
                assert_eq!(parse_memory(&bytes_quantity(v)), Ok(v), "{v}");
            }
            b *= 2;
        }
        assert_eq!(parse_memory(&bytes_quantity(u64::MAX)), Ok(u64::MAX));
        for m in (0..=64_000).step_by(7) {
            assert_eq!(parse_cpu(&cpu_text(m)), Ok(m), "{m}m");
        }
    }

    #[test]
    fn limits_and_cpu_read_as_quantities() {
        assert_eq!(memory_limit_text(-1), "unlimited");
        assert_eq!(memory_limit_text(i64::MAX), "unlimited");
        assert_eq!(memory_limit_text(256 * 1024 * 1024), "256Mi");
        assert_eq!(memory_limit_exact_text(69_828_608), "68192Ki");
        assert_eq!(memory_limit_exact_text(-1), "unlimited");
        assert_eq!(cpu_quota_text(50_000, 100_000), "500m");
        assert_eq!(cpu_quota_text(-1, 100_000), "unlimited");
        assert_eq!(cpu_text(1500), "1500m");
    }
}
