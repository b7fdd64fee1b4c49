//! The host <-> guest protocol over the one control channel (a virtio-serial
//! port on QEMU, a vsock connection on Firecracker).
//!
//! A frame is `kind: u8`, `len: u32` little-endian, then `len` bytes. The
//! guest speaks first (`Ready`), the host answers with `Start` (the run
//! spec, JSON); then stdin flows to the guest and stdout, stderr, the copy-out
//! archive and the guest's audit lines flow back; `Exit` is the guest's last
//! frame before it powers off.

use serde::{Deserialize, Serialize};

/// Largest payload accepted in one frame.
pub const MAX_FRAME: usize = 1 << 20;
/// Bytes of payload the senders put in one data frame.
pub const CHUNK: usize = 64 * 1024;

/// The virtio-serial port name the guest looks for.
pub const PORT_NAME: &str = "sbx.0";
/// The vsock port the guest connects to on the host (CID 2).
pub const VSOCK_PORT: u32 = 1024;

pub mod kind {
    /// guest -> host: init is up, send the spec. Payload: JSON [`super::Ready`].
    pub const READY: u8 = b'R';
    /// host -> guest: the run spec, JSON [`super::Spec`].
    pub const START: u8 = b'S';
    /// host -> guest: bytes for the command's stdin.
    pub const STDIN: u8 = b'I';
    /// host -> guest: stdin reached end-of-file.
    pub const STDIN_EOF: u8 = b'i';
    /// host -> guest: deliver a signal (payload: the number, one byte) to the command.
    pub const SIGNAL: u8 = b'K';
    /// host -> guest: a chunk of the copy-in tar archive.
    pub const COPY_IN: u8 = b'T';
    /// host -> guest: end of the copy-in archive.
    pub const COPY_IN_END: u8 = b't';
    /// guest -> host: the command's stdout.
    pub const STDOUT: u8 = b'O';
    /// guest -> host: the command's stderr.
    pub const STDERR: u8 = b'E';
    /// guest -> host: audit lines (whole JSON lines).
    pub const AUDIT: u8 = b'A';
    /// guest -> host: a chunk of the copy-out tar archive.
    pub const COPY_OUT: u8 = b'P';
    /// guest -> host: end of the copy-out archive.
    pub const COPY_OUT_END: u8 = b'p';
    /// guest -> host: the command is done, JSON [`super::ExitReport`]. Last frame.
    pub const EXIT: u8 = b'X';
    /// guest -> host: the guest could not run the command (one line).
    pub const FAIL: u8 = b'F';
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct Ready {
    /// Guest uptime (ms) when init reported.
    pub uptime_ms: u64,
    /// Names of the secrets the guest read from fw_cfg/MMDS (never values).
    pub secrets: Vec<String>,
    /// Where the secrets came from ("fw_cfg", "mmds", "none").
    pub secrets_source: String,
}

/// What the guest is asked to run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub argv: Vec<String>,
    /// The command's environment (secrets are added by the guest).
    pub env: Vec<(String, String)>,
    pub sbx_id: String,
    /// Host wall clock (Unix ms), to set the guest's clock.
    pub now_unix_ms: u64,
    /// Size of the tmpfs upper layer, bytes.
    pub tmpfs_bytes: u64,
    /// A copy-in archive follows (extracted to /work before the command starts).
    pub copy_in: bool,
    /// Send /work back as a tar archive after the command.
    pub copy_out: bool,
}

/// How the command ended.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct ExitReport {
    /// Exit code when it exited.
    pub code: Option<i32>,
    /// Signal number when it was killed by one.
    pub signal: Option<i32>,
    /// The command could not be started (126/127 in `code`).
    pub error: Option<String>,
}

impl ExitReport {
    /// The status sbx-vm exits with (chain rules: 128+N for a signal).
    pub fn status(&self) -> i32 {
        match (self.code, self.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            _ => 125,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtoError {
    #[error("frame of {0} bytes exceeds the limit")]
    TooLarge(usize),
}

pub fn encode(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(5 + payload.len());
    v.push(kind);
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// Reassembles frames from a byte stream.
#[derive(Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next complete frame, if any.
    pub fn next_frame(&mut self) -> Result<Option<(u8, Vec<u8>)>, ProtoError> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let len = u32::from_le_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_FRAME {
            return Err(ProtoError::TooLarge(len));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        let kind = self.buf[0];
        let payload = self.buf[5..5 + len].to_vec();
        self.buf.drain(..5 + len);
        Ok(Some((kind, payload)))
    }

    /// Bytes held that do not form a whole frame yet.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_roundtrip_in_pieces() {
        let mut bytes = encode(kind::STDOUT, b"hello");
        bytes.extend(encode(kind::STDIN_EOF, b""));
        let mut d = Decoder::default();
        for b in &bytes {
            d.push(std::slice::from_ref(b));
        }
        assert_eq!(
            d.next_frame().unwrap(),
            Some((kind::STDOUT, b"hello".to_vec()))
        );
        assert_eq!(d.next_frame().unwrap(), Some((kind::STDIN_EOF, vec![])));
        assert_eq!(d.next_frame().unwrap(), None);
        assert_eq!(d.pending(), 0);
    }

    #[test]
    fn oversized_frame_is_an_error() {
        let mut d = Decoder::default();
        d.push(&[b'O', 0xff, 0xff, 0xff, 0x7f]);
        assert!(matches!(d.next_frame(), Err(ProtoError::TooLarge(_))));
    }

    #[test]
    fn exit_status_rules() {
        let r = |code, signal| {
            ExitReport {
                code,
                signal,
                error: None,
            }
            .status()
        };
        assert_eq!(r(Some(42), None), 42);
        assert_eq!(r(None, Some(9)), 137);
        assert_eq!(r(None, None), 125);
    }
}
