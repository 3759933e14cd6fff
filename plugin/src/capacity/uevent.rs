//! Kernel uevents over netlink (`NETLINK_KOBJECT_UEVENT`, multicast group 1: the kernel's own
//! events, before udev), read with `tokio::io::unix::AsyncFd`.
//!
//! CPU and memory devices announce `online` / `offline` (and `add` / `remove` when hot-added or
//! removed) as `ACTION@DEVPATH\0ACTION=...\0DEVPATH=...\0SUBSYSTEM=cpu\0SEQNUM=...\0`.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use nix::sys::socket::{
    bind, recv, setsockopt, socket, sockopt, AddressFamily, MsgFlags, NetlinkAddr, SockFlag,
    SockProtocol, SockType,
};
use tokio::io::unix::AsyncFd;

use super::snapshot::Scope;

/// The kernel's uevent multicast group.
const KERNEL_GROUP: u32 = 1;

/// One uevent of a CPU or memory device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uevent {
    pub action: String,
    pub devpath: String,
    pub subsystem: String,
    pub seqnum: Option<u64>,
}

impl Uevent {
    /// Which part of the node to re-read, or `None` for devices the watcher does not follow.
    pub fn scope(&self) -> Option<Scope> {
        match self.subsystem.as_str() {
            "cpu" if self.devpath.starts_with("/devices/system/cpu/") => Some(Scope::Cpu),
            "memory" if self.devpath.starts_with("/devices/system/memory/") => Some(Scope::Memory),
            _ => None,
        }
    }
}

/// Parses one netlink message from the kernel group. `None` for anything that is not a
/// well-formed kernel uevent (udev's own `libudev` messages start with `libudev\0`).
pub fn parse(msg: &[u8]) -> Option<Uevent> {
    let mut fields = msg.split(|b| *b == 0).filter(|f| !f.is_empty());
    let header = std::str::from_utf8(fields.next()?).ok()?;
    let (action, devpath) = header.split_once('@')?;
    let mut ev = Uevent {
        action: action.to_owned(),
        devpath: devpath.to_owned(),
        subsystem: String::new(),
        seqnum: None,
    };
    for field in fields {
        let Ok(field) = std::str::from_utf8(field) else {
            continue;
        };
        match field.split_once('=') {
            Some(("SUBSYSTEM", v)) => v.clone_into(&mut ev.subsystem),
            Some(("SEQNUM", v)) => ev.seqnum = v.parse().ok(),
            Some(("ACTION", v)) => v.clone_into(&mut ev.action),
            _ => {}
        }
    }
    Some(ev)
}

/// Errors opening the uevent socket.
#[derive(Debug, thiserror::Error)]
pub enum UeventError {
    #[error("uevent socket: {op}: {source}")]
    Socket {
        op: &'static str,
        #[source]
        source: nix::Error,
    },
    #[error("uevent socket: register with the runtime: {0}")]
    Register(#[source] std::io::Error),
}

/// The socket, non-blocking, registered with tokio.
#[derive(Debug)]
pub struct UeventSocket {
    fd: AsyncFd<Fd>,
    buf: Vec<u8>,
}

#[derive(Debug)]
struct Fd(OwnedFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl UeventSocket {
    /// Opens and binds the socket to the kernel's group (needs `CAP_NET_ADMIN` in the initial
    /// network namespace on some kernels; root on the node). Inside a tokio runtime.
    pub fn open() -> Result<Self, UeventError> {
        let err = |op| move |source| UeventError::Socket { op, source };
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkKObjectUEvent,
        )
        .map_err(err("socket"))?;
        // A burst of hotplug events must not overflow the default buffer (ENOBUFS); a missed
        // event would still be caught by the resync.
        let _ = setsockopt(&fd, sockopt::RcvBuf, &(1 << 20));
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, KERNEL_GROUP)).map_err(err("bind"))?;
        #[expect(
            deprecated,
            reason = "`Fd` owns the socket and the AsyncFd owns `Fd`, which is the I/O safety \
                      tokio's `unsafe fn register` asks for; unsafe code is denied in this crate"
        )]
        let fd = AsyncFd::new(Fd(fd)).map_err(UeventError::Register)?;
        Ok(UeventSocket {
            fd,
            buf: vec![0; 16 * 1024],
        })
    }

    /// Waits for the next batch of messages and moves the CPU and memory uevents of it into
    /// `out`. Returns how many messages were read (0 never: it waits). `ENOBUFS` (the kernel
    /// dropped messages) is returned as an error so the caller can re-read everything.
    pub async fn recv(&mut self, out: &mut Vec<Uevent>) -> std::io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            let mut read = 0usize;
            loop {
                match recv(
                    guard.get_inner().as_raw_fd(),
                    &mut self.buf,
                    MsgFlags::empty(),
                ) {
                    Ok(n) => {
                        read += 1;
                        if let Some(ev) = parse(&self.buf[..n]) {
                            if ev.scope().is_some() {
                                out.push(ev);
                            }
                        }
                    }
                    Err(nix::Error::EAGAIN) => {
                        guard.clear_ready();
                        break;
                    }
                    Err(nix::Error::EINTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if read > 0 {
                return Ok(read);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_uevents_and_picks_cpu_and_memory() {
        let cpu = b"offline@/devices/system/cpu/cpu1\0ACTION=offline\0DEVPATH=/devices/system/cpu/cpu1\0SUBSYSTEM=cpu\0SEQNUM=4711\0";
        let ev = parse(cpu).expect("parse");
        assert_eq!(ev.action, "offline");
        assert_eq!(ev.devpath, "/devices/system/cpu/cpu1");
        assert_eq!(ev.seqnum, Some(4711));
        assert_eq!(ev.scope(), Some(Scope::Cpu));

        let mem = b"online@/devices/system/memory/memory40\0ACTION=online\0DEVPATH=/devices/system/memory/memory40\0SUBSYSTEM=memory\0SEQNUM=9\0";
        assert_eq!(parse(mem).expect("parse").scope(), Some(Scope::Memory));

        let net = b"add@/devices/virtual/net/veth0\0ACTION=add\0SUBSYSTEM=net\0SEQNUM=1\0";
        assert_eq!(parse(net).expect("parse").scope(), None);
        // The cpu subsystem also has e.g. machine-check devices elsewhere: not followed.
        let mce = b"add@/devices/system/machinecheck/machinecheck0\0SUBSYSTEM=cpu\0";
        assert_eq!(parse(mce).expect("parse").scope(), None);
    }

    #[test]
    fn rejects_what_is_not_a_kernel_uevent() {
        assert_eq!(parse(b""), None);
        assert_eq!(parse(b"libudev\0\xfe\xed\xca\xfe"), None);
        assert_eq!(parse(b"\xff\xfe@x\0"), None);
        // Fields that are not UTF-8 are skipped, not fatal.
        let ev = parse(b"change@/devices/system/cpu/cpu0\0X=\xff\0SUBSYSTEM=cpu\0").expect("parse");
        assert_eq!(ev.scope(), Some(Scope::Cpu));
    }
}
