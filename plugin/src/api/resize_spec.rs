//! The `resize` CLI command's target syntax: `cpu=1500m,memory=512Mi` per container.

use crate::resize::ContainerTarget;

/// Why a `resize` target could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetSpecError {
    #[error("{part:?}: expected key=value")]
    NotKeyValue { part: String },
    #[error("unknown resource {resource:?} (cpu, memory)")]
    UnknownResource { resource: String },
    #[error("{spec:?}: give cpu= and/or memory=")]
    Empty { spec: String },
    #[error("bad CPU quantity {value:?} (e.g. 1500m or 1.5)")]
    Cpu { value: String },
    #[error("bad memory quantity {value:?} (e.g. 512Mi, 2Gi, 1048576)")]
    Memory { value: String },
}

/// Parses the CLI's `cpu=1500m,memory=512Mi` into a target.
pub fn parse_target(spec: &str) -> Result<ContainerTarget, TargetSpecError> {
    let mut t = ContainerTarget::default();
    for part in spec.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| TargetSpecError::NotKeyValue {
                part: part.to_string(),
            })?;
        match k {
            "cpu" => t.cpu_millis = Some(parse_cpu(v)?),
            "memory" => t.memory_bytes = Some(parse_memory(v)?),
            other => {
                return Err(TargetSpecError::UnknownResource {
                    resource: other.to_string(),
                })
            }
        }
    }
    if t.cpu_millis.is_none() && t.memory_bytes.is_none() {
        return Err(TargetSpecError::Empty {
            spec: spec.to_string(),
        });
    }
    Ok(t)
}

fn parse_cpu(v: &str) -> Result<u64, TargetSpecError> {
    let bad = || TargetSpecError::Cpu {
        value: v.to_string(),
    };
    if let Some(m) = v.strip_suffix('m') {
        return m.parse().map_err(|_| bad());
    }
    let f: f64 = v.parse().map_err(|_| bad())?;
    if !(0.0..=100_000.0).contains(&f) {
        return Err(bad());
    }
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "range checked above"
    )]
    Ok((f * 1000.0).round() as u64)
}

fn parse_memory(v: &str) -> Result<u64, TargetSpecError> {
    let bad = || TargetSpecError::Memory {
        value: v.to_string(),
    };
    let (num, mult) = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("K", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ]
    .iter()
    .find_map(|(s, m)| v.strip_suffix(s).map(|n| (n, *m)))
    .unwrap_or((v, 1));
    num.parse::<u64>()
        .map_err(|_| bad())?
        .checked_mul(mult)
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cli_targets() {
        assert_eq!(
            parse_target("cpu=1500m,memory=512Mi").unwrap(),
            ContainerTarget {
                cpu_millis: Some(1500),
                memory_bytes: Some(512 << 20)
            }
        );
        assert_eq!(parse_target("cpu=2").unwrap().cpu_millis, Some(2000));
        assert_eq!(parse_target("cpu=0.25").unwrap().cpu_millis, Some(250));
        assert_eq!(
            parse_target("memory=1Gi").unwrap().memory_bytes,
            Some(1 << 30)
        );
        for bad in [
            "",
            "cpu",
            "gpu=1",
            "cpu=lots",
            "memory=12Xi",
            "cpu=-1",
            "memory=99999999999999Ti",
        ] {
            assert!(parse_target(bad).is_err(), "{bad:?}");
        }
    }
}
