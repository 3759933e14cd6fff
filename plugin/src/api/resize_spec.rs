//! The `resize` CLI command's target syntax: `cpu=1500m,memory=512Mi` per container, each value a
//! Kubernetes quantity (`1.5`, `250m`; `1.5Gi`, `512Ki`), read as the config file reads them.

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
    #[error("bad CPU quantity {value:?}: {why}")]
    Cpu { value: String, why: String },
    #[error("bad memory quantity {value:?}: {why}")]
    Memory { value: String, why: String },
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
    crate::policy::parse_cpu(v).map_err(|e| TargetSpecError::Cpu {
        value: v.to_string(),
        why: e.to_string(),
    })
}

fn parse_memory(v: &str) -> Result<u64, TargetSpecError> {
    crate::policy::parse_memory(v).map_err(|e| TargetSpecError::Memory {
        value: v.to_string(),
        why: e.to_string(),
    })
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
        assert_eq!(
            parse_target("memory=1.5Gi").unwrap().memory_bytes,
            Some(3 << 29)
        );
        assert_eq!(
            parse_target("memory=512Ki").unwrap().memory_bytes,
            Some(512 << 10)
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
