//! How the configuration file spells sizes and times: Kubernetes quantities (`"1Gi"`, `"250m"`)
//! and humantime durations (`"60s"`, `"100ms"`). The daemon keeps bytes, millicores and
//! milliseconds; these adapters read and write the person's spelling. (serde's `with` hands
//! `serialize` a reference, hence `&u64`.)
#![allow(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's `with` calls serialize(&field, serializer)"
)]

use std::fmt;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserializer, Serializer};

use crate::policy::{bytes_quantity, cpu_text, parse_cpu, parse_memory, QuantityError};

/// A quantity as a string (`"512Mi"`) or a bare TOML number (bytes for memory, cores for CPU,
/// as a bare number means in a pod spec).
struct QuantityVisitor {
    parse: fn(&str) -> Result<u64, QuantityError>,
    expecting: &'static str,
}

impl Visitor<'_> for QuantityVisitor {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.expecting)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        (self.parse)(v).map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        self.visit_str(&v.to_string())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        self.visit_str(&v.to_string())
    }

    /// `0.5` (cores), as YAML values written into the file by the Helm chart arrive.
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
        self.visit_str(&v.to_string())
    }
}

/// Memory: `"1Gi"`, `"512Mi"` (or an integer of bytes); written back exactly (`"1536Mi"`).
pub mod memory {
    use super::{bytes_quantity, parse_memory, Deserializer, QuantityVisitor, Serializer};

    pub fn serialize<S: Serializer>(bytes: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&bytes_quantity(*bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        d.deserialize_any(QuantityVisitor {
            parse: parse_memory,
            expecting: "a memory quantity such as \"1Gi\" or \"512Mi\"",
        })
    }
}

/// CPU in millicores: `"250m"`, `"1.5"` (or an integer of cores); written back as `"250m"`.
pub mod cpu {
    use super::{cpu_text, parse_cpu, Deserializer, QuantityVisitor, Serializer};

    pub fn serialize<S: Serializer>(millis: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&cpu_text(*millis))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        d.deserialize_any(QuantityVisitor {
            parse: parse_cpu,
            expecting: "a CPU quantity such as \"250m\" or \"1.5\"",
        })
    }
}

/// Milliseconds, spelled as a humantime duration (`"60s"`, `"100ms"`, `"1m 30s"`); the only
/// duration form the configuration takes.
pub mod millis {
    use super::{de, Deserializer, Duration, Serializer};

    pub fn serialize<S: Serializer>(ms: &u64, s: S) -> Result<S::Ok, S::Error> {
        humantime_serde::serialize(&Duration::from_millis(*ms), s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let d: Duration = humantime_serde::deserialize(d)?;
        if d.subsec_nanos() % 1_000_000 != 0 {
            return Err(de::Error::custom(format!(
                "{} is finer than a millisecond",
                humantime_serde::re::humantime::format_duration(d)
            )));
        }
        u64::try_from(d.as_millis()).map_err(|_| de::Error::custom("duration too long"))
    }
}
