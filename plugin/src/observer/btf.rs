//! Struct offsets and enum values of the running kernel, from its BTF.
//!
//! Rust eBPF has no CO-RE relocations, so the observer's programs read kernel structs through
//! offsets that user space resolves here at start-up and passes in the `CONFIG` global.

use std::path::Path;

use btf_rs::{Btf, Type};

use super::ObserverError;

/// A kernel's BTF, with lookups by name.
pub struct KernelBtf {
    btf: Btf,
}

impl std::fmt::Debug for KernelBtf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelBtf").finish_non_exhaustive()
    }
}

/// Where a struct member lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberLocation {
    /// Offset in bits from the start of the struct.
    pub bit_offset: u32,
    /// Width in bits if the member is a bitfield.
    pub bitfield_size: Option<u32>,
}

impl MemberLocation {
    /// Byte offset of the member (of the byte holding it, for a bitfield).
    #[must_use]
    pub fn byte_offset(self) -> u32 {
        self.bit_offset / 8
    }

    /// Mask selecting the member within the byte at `byte_offset` (a flag of at most 8 bits).
    #[must_use]
    pub fn byte_mask(self) -> u32 {
        match self.bitfield_size {
            Some(bits) if bits < 8 => ((1u32 << bits) - 1) << (self.bit_offset % 8),
            _ => 0xff,
        }
    }
}

impl KernelBtf {
    /// Reads the whole file first and parses it from memory: btf-rs's file reader asks the
    /// position of its buffered reader for every type, one `lseek` on sysfs each (some
    /// hundred thousand for a kernel's BTF), which made most of the daemon's start-up.
    pub fn from_file(path: &Path) -> Result<Self, ObserverError> {
        let bytes = std::fs::read(path).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                ObserverError::NoBtf {
                    path: path.to_owned(),
                }
            } else {
                ObserverError::Io {
                    path: path.to_owned(),
                    source,
                }
            }
        })?;
        let btf = Btf::from_bytes(&bytes).map_err(|e| ObserverError::Btf {
            path: path.to_owned(),
            reason: format!("{e:#}"),
        })?;
        Ok(Self { btf })
    }

    fn err(what: impl Into<String>) -> ObserverError {
        ObserverError::BtfLookup(what.into())
    }

    /// Members of the struct or union called `name` (the first definition, not a forward).
    fn composite(&self, name: &str) -> Result<btf_rs::Struct, ObserverError> {
        let types = self
            .btf
            .resolve_types_by_name(name)
            .map_err(|e| Self::err(format!("type {name}: {e}")))?;
        types
            .into_iter()
            .find_map(|t| match t {
                Type::Struct(s) | Type::Union(s) => Some(s),
                _ => None,
            })
            .ok_or_else(|| Self::err(format!("struct {name} not found")))
    }

    /// Location of `member` in struct `name`, looking through anonymous structs and unions.
    pub fn member(&self, name: &str, member: &str) -> Result<MemberLocation, ObserverError> {
        let s = self.composite(name)?;
        self.find_member(&s, member, 0)?
            .ok_or_else(|| Self::err(format!("{name}::{member} not found")))
    }

    fn find_member(
        &self,
        s: &btf_rs::Struct,
        wanted: &str,
        depth: u32,
    ) -> Result<Option<MemberLocation>, ObserverError> {
        for m in &s.members {
            let name = self.btf.resolve_name(m).unwrap_or_default();
            if name == wanted {
                return Ok(Some(MemberLocation {
                    bit_offset: m.bit_offset(),
                    bitfield_size: m.bitfield_size().filter(|&bits| bits != 0),
                }));
            }
            if name.is_empty() && depth < 8 {
                let Ok(mut ty) = self.btf.resolve_chained_type(m) else {
                    continue;
                };
                // Skip qualifiers and typedefs down to the anonymous struct/union.
                for _ in 0..8 {
                    match ty {
                        Type::Typedef(_)
                        | Type::Const(_)
                        | Type::Volatile(_)
                        | Type::Restrict(_) => {
                            let Some(inner) = ty.as_btf_type() else { break };
                            let Ok(next) = self.btf.resolve_chained_type(inner) else {
                                break;
                            };
                            ty = next;
                        }
                        _ => break,
                    }
                }
                if let Type::Struct(inner) | Type::Union(inner) = ty {
                    if let Some(loc) = self.find_member(&inner, wanted, depth + 1)? {
                        return Ok(Some(MemberLocation {
                            bit_offset: m.bit_offset() + loc.bit_offset,
                            bitfield_size: loc.bitfield_size,
                        }));
                    }
                }
            }
        }
        Ok(None)
    }

    /// Byte offset of a member that is not a bitfield.
    pub fn offset(&self, name: &str, member: &str) -> Result<u32, ObserverError> {
        let loc = self.member(name, member)?;
        if loc.bitfield_size.is_some() || loc.bit_offset % 8 != 0 {
            return Err(Self::err(format!("{name}::{member} is a bitfield")));
        }
        Ok(loc.byte_offset())
    }

    /// Value of `enumerator` in `enum name`.
    pub fn enum_value(&self, name: &str, enumerator: &str) -> Result<u32, ObserverError> {
        let types = self
            .btf
            .resolve_types_by_name(name)
            .map_err(|e| Self::err(format!("enum {name}: {e}")))?;
        for t in types {
            if let Type::Enum(e) = t {
                for m in &e.members {
                    if self.btf.resolve_name(m).is_ok_and(|n| n == enumerator) {
                        return Ok(m.val());
                    }
                }
            }
        }
        Err(Self::err(format!("enum {name}: no {enumerator}")))
    }

    /// Whether parameter `index` of the BTF-enabled tracepoint `tracepoint` (its
    /// `btf_trace_<tracepoint>` typedef; parameter 0 is the context) is a pointer to `struct
    /// wanted`. Tracepoints change prototypes across kernels: `oom/mark_victim` passes
    /// `int pid` up to 6.7 and `struct task_struct *` from 6.8.
    pub fn tracepoint_param_is_struct_ptr(
        &self,
        tracepoint: &str,
        index: usize,
        wanted: &str,
    ) -> Result<bool, ObserverError> {
        let typedef = format!("btf_trace_{tracepoint}");
        let types = self
            .btf
            .resolve_types_by_name(&typedef)
            .map_err(|e| Self::err(format!("typedef {typedef}: {e}")))?;
        let Some(Type::Typedef(td)) = types.into_iter().find(|t| matches!(t, Type::Typedef(_)))
        else {
            return Err(Self::err(format!("typedef {typedef} not found")));
        };
        let chained = |t: &dyn btf_rs::BtfType| {
            self.btf
                .resolve_chained_type(t)
                .map_err(|e| Self::err(format!("{typedef}: {e}")))
        };
        let Type::Ptr(ptr) = chained(&td)? else {
            return Err(Self::err(format!("{typedef} is not a function pointer")));
        };
        let Type::FuncProto(proto) = chained(&ptr)? else {
            return Err(Self::err(format!("{typedef} is not a function pointer")));
        };
        let Some(param) = proto.parameters.get(index) else {
            return Ok(false);
        };
        Ok(self.pointee_struct(param, &typedef)?.as_deref() == Some(wanted))
    }

    /// The name of the struct a parameter points to; `None` for a parameter of another type.
    fn pointee_struct(
        &self,
        param: &dyn btf_rs::BtfType,
        context: &str,
    ) -> Result<Option<String>, ObserverError> {
        let chained = |t: &dyn btf_rs::BtfType| {
            self.btf
                .resolve_chained_type(t)
                .map_err(|e| Self::err(format!("{context}: {e}")))
        };
        let Type::Ptr(ptr) = chained(param)? else {
            return Ok(None);
        };
        Ok(match chained(&ptr)? {
            Type::Struct(s) => self.btf.resolve_name(&s).ok(),
            _ => None,
        })
    }

    /// The parameters of the kernel function `name` (a target for fentry and fexit), each as
    /// the name of the struct it points to (`None` for a parameter of another type).
    /// Functions change prototypes across kernels: `try_to_free_mem_cgroup_pages` takes 4
    /// parameters on 6.1 and 5 on 6.12 (`swappiness` came in between).
    pub fn function_params(&self, name: &str) -> Result<Vec<Option<String>>, ObserverError> {
        let types = self
            .btf
            .resolve_types_by_name(name)
            .map_err(|e| Self::err(format!("function {name}: {e}")))?;
        let Some(Type::Func(func)) = types.into_iter().find(|t| matches!(t, Type::Func(_))) else {
            return Err(Self::err(format!("no function {name}")));
        };
        let Type::FuncProto(proto) = self
            .btf
            .resolve_chained_type(&func)
            .map_err(|e| Self::err(format!("function {name}: {e}")))?
        else {
            return Err(Self::err(format!("function {name} has no prototype")));
        };
        proto
            .parameters
            .iter()
            .map(|p| self.pointee_struct(p, name))
            .collect()
    }

    /// Whether the kernel has a function called `name` (a target for fentry).
    pub fn has_function(&self, name: &str) -> bool {
        self.btf
            .resolve_types_by_name(name)
            .is_ok_and(|types| types.iter().any(|t| matches!(t, Type::Func(_))))
    }
}
