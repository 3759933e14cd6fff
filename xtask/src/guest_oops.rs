//! Reading a guest kernel's oops on the VM tier's console: whether the emulated CPU's own state
//! was impossible when it died, which places the fault in the emulator rather than in the guest
//! kernel or the code under test.
//!
//! In 64-bit mode no guest instruction can set RFLAGS' VM bit (17) or its reserved bits (3, 5,
//! 15, 22–63), nor clear bit 1: `popf`, `iretq` and `sysretq` mask them. A kernel-mode register
//! dump (`RSP: 0018:…`) with such a value was corrupted below the guest. CI saw one in a 6.12
//! guest (`Oops: double fault` at a `pushf` in `obj_cgroup_charge`, EFLAGS `05520602`: with VM
//! set, QEMU's `pushf` raises #GP as in virtual-8086 mode, and delivering that #GP at the same
//! privilege with VM set raises another: a double fault).

/// Bits of a 64-bit mode RFLAGS that no instruction can set (VM, the reserved ones).
const IMPOSSIBLE_SET: u64 = (1 << 17) | (1 << 3) | (1 << 5) | (1 << 15) | !((1 << 22) - 1);

/// What the console says of an impossible RFLAGS in a kernel-mode register dump, if it has one:
/// a sentence for the failure report.
pub fn impossible_rflags(console: &str) -> Option<String> {
    let mut oops = None;
    for line in console.lines() {
        if let Some(at) = line.find("Oops: ").or_else(|| line.find("BUG: ")) {
            oops = Some(line[at..].trim().to_owned());
        }
        // `RSP: 0018:ffffc90000527758 EFLAGS: 05520602`: kernel mode (selector 0x18).
        let Some(rest) = line.split("RSP: 0018:").nth(1) else {
            continue;
        };
        let Some(flags) = rest
            .split("EFLAGS: ")
            .nth(1)
            .and_then(|f| u64::from_str_radix(f.split_whitespace().next()?, 16).ok())
        else {
            continue;
        };
        if flags & IMPOSSIBLE_SET != 0 || flags & 0b10 == 0 {
            return Some(format!(
                "the guest died ({}) with kernel-mode EFLAGS {flags:08x}, a value no instruction \
                 can load in 64-bit mode (VM or reserved bits set{}): the emulated CPU's state \
                 was corrupted below the guest (QEMU/TCG or the host), not by the guest kernel \
                 or the code under test; see docs/development.md, \"Found by the guest\"",
                oops.as_deref()
                    .unwrap_or("no oops line before the register dump"),
                if flags & (1 << 17) == 0 {
                    ""
                } else {
                    ": VM, virtual-8086 mode"
                },
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_double_fault_ci_saw_is_named_the_emulator_s() {
        let console = "[  442.134938] traps: PANIC: double fault, error_code: 0x0\n\
            [  442.137273] Oops: double fault: 0000 [#1] PREEMPT SMP NOPTI\n\
            [  442.138253] Code: 00 00 00 90 <9c> 58\n\
            [  442.138364] RSP: 0018:ffffc90000527758 EFLAGS: 05520602\n\
            [  442.140379] RSP: 002b:00003109ec5b69d8 EFLAGS: 00000202 ORIG_RAX: 0000000000000001\n";
        let why = impossible_rflags(console).expect("named");
        assert!(why.contains("Oops: double fault"), "{why}");
        assert!(why.contains("EFLAGS 05520602"), "{why}");
        assert!(why.contains("VM, virtual-8086 mode"), "{why}");
    }

    #[test]
    fn an_ordinary_oops_is_left_to_the_reader() {
        // The int3 oops of MTTCG's stale translations: plausible kernel-mode flags.
        let console = "Oops: int3: 0000 [#1] PREEMPT SMP NOPTI\n\
            RSP: 0018:ffffc900004f3c30 EFLAGS: 00000046\n\
            RSP: 002b:00007ffd40a911c8 EFLAGS: 00000202\n";
        assert_eq!(impossible_rflags(console), None);
        assert_eq!(impossible_rflags(""), None);
    }

    #[test]
    fn a_user_mode_dump_is_not_judged() {
        assert_eq!(
            impossible_rflags("RSP: 002b:00007ffd40a911c8 EFLAGS: 00020202\n"),
            None
        );
    }
}
