//! Quantities as people read them, in Kubernetes' notation: `500m`, `128Mi`, `66.6Mi`, `2Gi`,
//! `unlimited`. Every text a person reads (status, reasons, logs, the demo) uses these.

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
    fn limits_and_cpu_read_as_quantities() {
        assert_eq!(memory_limit_text(-1), "unlimited");
        assert_eq!(memory_limit_text(i64::MAX), "unlimited");
        assert_eq!(memory_limit_text(256 * 1024 * 1024), "256Mi");
        assert_eq!(cpu_quota_text(50_000, 100_000), "500m");
        assert_eq!(cpu_quota_text(-1, 100_000), "unlimited");
        assert_eq!(cpu_text(1500), "1500m");
    }
}
