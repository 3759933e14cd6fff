//! How the configuration file spells sizes and times: Kubernetes quantities (`"1Gi"`, `"250m"`)
//! and humantime durations (`"60s"`, `"100ms"`). The daemon keeps bytes, millicores and
//! milliseconds; these adapters read and write the person's spelling, and say it in the
//! configuration's JSON Schema (`schema`: the patterns of [`QUANTITY_PATTERN`] and
//! [`DURATION_PATTERN`], tested below against the parsers). (serde's `with` hands `serialize` a
//! reference, hence `&u64`.)
#![allow(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's `with` calls serialize(&field, serializer)"
)]

use std::fmt;
use std::time::Duration;

use schemars::{json_schema, Schema, SchemaGenerator};
use serde::de::{self, Visitor};
use serde::{Deserializer, Serializer};

use crate::policy::{bytes_quantity, cpu_text, parse_cpu, parse_memory, QuantityError};

/// Kubernetes' quantity grammar as [`parse_memory`] and [`parse_cpu`] read it: a non-negative
/// decimal number and one optional suffix (binary `Ki`..`Ei`, decimal `n u m k M G T P E`, or an
/// exponent `e<n>`).
pub const QUANTITY_PATTERN: &str =
    r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$";

/// humantime's duration grammar (`"60s"`, `"1m 30s"`, `"1.5h"`, `"0"`): numbers, each with a
/// unit.
pub const DURATION_PATTERN: &str = r"^(0|([0-9]+(\.[0-9]+)?\s*(nanos|nsec|ns|usec|us|µs|millis|msec|ms|seconds|second|secs|sec|s|minutes|minute|mins|min|m|hours|hour|hrs|hr|h|days|day|d|weeks|week|wks|wk|w|months|month|M|years|year|yrs|yr|y)\s*)+)$";

/// A quantity: a string of [`QUANTITY_PATTERN`], or a bare non-negative number.
fn quantity_schema(what: &str) -> Schema {
    json_schema!({
        "type": ["string", "number"],
        "pattern": QUANTITY_PATTERN,
        "minimum": 0,
        "description": what,
    })
}

/// A humantime duration (the configuration's one form of a time): a string of
/// [`DURATION_PATTERN`]. For `Duration` fields read with `humantime_serde`.
pub fn duration_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "pattern": DURATION_PATTERN,
        "description": "a duration such as \"60s\", \"500ms\" or \"1m 30s\"",
    })
}

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
    use super::{
        bytes_quantity, parse_memory, quantity_schema, Deserializer, QuantityVisitor, Schema,
        SchemaGenerator, Serializer,
    };

    pub fn schema(_: &mut SchemaGenerator) -> Schema {
        quantity_schema("a memory quantity such as \"1Gi\" or \"512Mi\" (a number: bytes)")
    }

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
    use super::{
        cpu_text, parse_cpu, quantity_schema, Deserializer, QuantityVisitor, Schema,
        SchemaGenerator, Serializer,
    };

    pub fn schema(_: &mut SchemaGenerator) -> Schema {
        quantity_schema("a CPU quantity such as \"250m\" or \"1.5\" (a number: cores)")
    }

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
    use super::{de, Deserializer, Duration, Schema, SchemaGenerator, Serializer};

    pub fn schema(g: &mut SchemaGenerator) -> Schema {
        super::duration_schema(g)
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The patterns the chart's schema checks with accept exactly what the daemon's parsers
    /// accept, on the spellings people write and the mistakes they make (surrounding blanks,
    /// which the parsers trim, are left out: the pattern refuses them).
    #[test]
    fn the_patterns_agree_with_the_parsers() {
        let quantity = regex::Regex::new(QUANTITY_PATTERN).expect("QUANTITY_PATTERN");
        for text in [
            "1Gi", "1.5Gi", "512Mi", "0", "1000", "1e9", "1E3", "2G", "250m", "1.5", ".5", "1.",
            "+1Ki", "1e-3", "1.5Gx", "16MB", "1GiB", "-1Gi", "Gi", "", "1 Gi", "lots", "1.2.3",
            "e3", "1e", "0x10",
        ] {
            assert_eq!(
                quantity.is_match(text),
                parse_memory(text).is_ok(),
                "memory {text:?}: pattern and parser disagree"
            );
            assert_eq!(
                quantity.is_match(text),
                parse_cpu(text).is_ok(),
                "cpu {text:?}: pattern and parser disagree"
            );
        }
        let duration = regex::Regex::new(DURATION_PATTERN).expect("DURATION_PATTERN");
        let parse = humantime_serde::re::humantime::parse_duration;
        for text in [
            "60s",
            "100ms",
            "1m 30s",
            "1m30s",
            "0",
            "2h",
            "1.5s",
            "5m",
            "1d",
            "2 min",
            "1µs",
            "60",
            "5000",
            "1.5x",
            "",
            "s",
            "-1s",
            "1 minute and a half",
            "1.s",
            "0s",
        ] {
            assert_eq!(
                duration.is_match(text),
                parse(text).is_ok(),
                "duration {text:?}: pattern and parser disagree"
            );
        }
    }
}
