//! The sandbox's nftables rules, loaded through libnftables in-process
//! (dlopen'ed before fork; called in the child inside the new namespace), so
//! no `nft` process is spawned and no capability has to survive an exec.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::io;

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("cannot load libnftables.so.1 (install the nftables package): {0}")]
    Load(String),
}

type CtxNew = unsafe extern "C" fn(u32) -> *mut c_void;
type CtxFree = unsafe extern "C" fn(*mut c_void);
type BufferError = unsafe extern "C" fn(*mut c_void) -> c_int;
type GetError = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type RunCmd = unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int;

/// libnftables entry points.
#[derive(Clone, Copy)]
pub struct Nft {
    ctx_new: CtxNew,
    ctx_free: CtxFree,
    buffer_error: BufferError,
    get_error: GetError,
    buffer_output: BufferError,
    run: RunCmd,
}

/// # Safety
/// `h` is a live dlopen handle and `T` is a function-pointer type matching
/// the C prototype of `name`.
unsafe fn sym<T: Copy>(h: *mut c_void, name: &CStr) -> Result<T, NftError> {
    // SAFETY: `h` is a live dlopen handle (caller's promise); `name` is a
    // NUL-terminated CStr.
    let p = unsafe { libc::dlsym(h, name.as_ptr()) };
    if p.is_null() {
        return Err(NftError::Load(format!("symbol {name:?} missing")));
    }
    // SAFETY: `p` is a non-null code address and `T` is a function pointer
    // of the symbol's prototype (caller's promise), pointer-sized like `p`.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

impl Nft {
    pub fn load() -> Result<Self, NftError> {
        let mut h = std::ptr::null_mut();
        for name in [c"libnftables.so.1", c"libnftables.so"] {
            // SAFETY: `name` is a NUL-terminated CStr; libnftables has no
            // constructors that need more than a loaded libc.
            h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if !h.is_null() {
                break;
            }
        }
        if h.is_null() {
            // SAFETY: dlerror(3) takes no arguments; its string is read
            // just below, before any other dl* call.
            let e = unsafe { libc::dlerror() };
            let msg = if e.is_null() {
                "not found".to_string()
            } else {
                // SAFETY: `e` is non-null and dlerror returns a
                // NUL-terminated string valid until the next dl* call.
                unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
            };
            return Err(NftError::Load(msg));
        }
        // SAFETY: `h` is a live handle, never dlclose'd (the pointers stay
        // valid for the process's life); each type alias above is the
        // prototype in <nftables/libnftables.h>.
        unsafe {
            Ok(Nft {
                ctx_new: sym(h, c"nft_ctx_new")?,
                ctx_free: sym(h, c"nft_ctx_free")?,
                buffer_error: sym(h, c"nft_ctx_buffer_error")?,
                get_error: sym(h, c"nft_ctx_get_error_buffer")?,
                buffer_output: sym(h, c"nft_ctx_buffer_output")?,
                run: sym(h, c"nft_run_cmd_from_buffer")?,
            })
        }
    }

    /// Runs a ruleset (nft syntax) in the current network namespace. On
    /// failure, nft's own message goes into `err`.
    pub fn run(&self, ruleset: &CStr, err: &mut String) -> io::Result<()> {
        // SAFETY: the function pointers come from `load` (right prototypes,
        // library never unloaded); `ctx` is checked non-null, used only
        // here and freed once at the end; `ruleset` is NUL-terminated; the
        // error buffer is NUL-terminated and read before ctx_free.
        unsafe {
            let ctx = (self.ctx_new)(0);
            if ctx.is_null() {
                return Err(io::Error::other("nft_ctx_new failed"));
            }
            (self.buffer_error)(ctx);
            (self.buffer_output)(ctx);
            let rc = (self.run)(ctx, ruleset.as_ptr());
            let res = if rc != 0 {
                let e = (self.get_error)(ctx);
                if !e.is_null() {
                    err.push_str(CStr::from_ptr(e).to_string_lossy().trim());
                }
                Err(io::Error::from_raw_os_error(libc::EPERM))
            } else {
                Ok(())
            };
            (self.ctx_free)(ctx);
            res
        }
    }
}

/// Addresses and ports of the sandbox side.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// The extra address on `lo` (source of every outgoing connection).
    pub v4: std::net::Ipv4Addr,
    pub v6: std::net::Ipv6Addr,
    /// Where redirected TCP lands (127.0.0.1 and ::1 inside).
    pub tcp_port: u16,
    /// Where redirected DNS over UDP lands.
    pub dns_port: u16,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            v4: std::net::Ipv4Addr::new(10, 254, 0, 1),
            v6: "fd5b:5b5b:5b5b::1".parse().unwrap(),
            tcp_port: 61001,
            dns_port: 61053,
        }
    }
}

/// The ruleset: every DNS packet (UDP or TCP port 53, loopback servers such
/// as 127.0.0.53 included, so resolv.conf may say anything) and every TCP
/// connection to a non-loopback address is redirected to the gateway's
/// sockets; whatever else would leave the sandbox's own addresses is
/// dropped. TCP SYNs to non-loopback addresses first pass the SYN queue
/// (before the redirect, priority -150; [`crate::synq`] appends the queue
/// rule to the empty chain): a denied one comes back marked and is rejected
/// with a reset, so connect() is refused.
pub fn ruleset(l: &Layout) -> CString {
    let text = format!(
        "table inet sbx_net {{
  chain nat_out {{
    type nat hook output priority -100; policy accept;
    udp dport 53 redirect to :{dns}
    tcp dport 53 redirect to :{tcp}
    ip daddr 127.0.0.0/8 return
    ip6 daddr ::1 return
    meta l4proto tcp redirect to :{tcp}
  }}
  chain filter_out {{
    type filter hook output priority 0; policy drop;
    ip daddr {{ 127.0.0.0/8, {v4} }} accept
    ip6 daddr {{ ::1, {v6} }} accept
  }}
}}
table ip {syn} {{
  chain out {{
    type filter hook output priority -150; policy accept;
    meta mark {mark} reject with tcp reset
    ip daddr != 127.0.0.0/8 tcp dport != 53 tcp flags & (fin|syn|rst|ack) == syn meta mark 0 jump {q}
  }}
  chain {q} {{
  }}
}}
table ip6 {syn} {{
  chain out {{
    type filter hook output priority -150; policy accept;
    meta mark {mark} reject with tcp reset
    ip6 daddr != ::1 tcp dport != 53 tcp flags & (fin|syn|rst|ack) == syn meta mark 0 jump {q}
  }}
  chain {q} {{
  }}
}}
",
        tcp = l.tcp_port,
        dns = l.dns_port,
        v4 = l.v4,
        v6 = l.v6,
        syn = crate::synq::TABLE,
        q = crate::synq::QCHAIN,
        mark = crate::synq::DENY_MARK,
    );
    CString::new(text).expect("no NUL in ruleset")
}
